// Router: maps (method, raw path) to a route id. Sans-IO and immutable: build() validates every
// pattern once, at startup, and reports all problems together; match() is then a read-only walk of
// a segment trie, safe to call from any number of threads, that allocates nothing but the decoded
// values of {name} parameters (and the wildcard string, whose capacity the Request keeps).
//
// Pattern syntax: "[METHOD ]/path". METHOD is an uppercase token (GET, POST, PROPFIND, ...);
// without it the route answers any method. The path is '/'-separated segments, each one of:
//   literal   text compared with the *percent-decoded* request segment (a pattern may escape too:
//             "/a%20b" is the literal "a b"); '{', '}' and '*' cannot appear in a literal
//   {name}    one whole, non-empty segment, decoded into a Param called `name` (an identifier)
//   *         last segment only: the rest of the path, zero or more segments. "/static/*" matches
//             "/static", "/static/" and "/static/a/b"; Request::wildcard gets "", "" and "a/b".
// Empty segments: a pattern may end in '/' ("/" itself, "/a/"); an empty segment elsewhere is a
// syntax error. "/a/" and "/a" are distinct routes: neither matches the other's path. A request
// path "/a//b" has an empty middle segment that no literal or {param} matches (a wildcard before it
// takes it in: "/a/*" gives the wildcard "/b").
//
// Precedence, segment by segment: literal > {param} > '*'; a longer wildcard prefix before a
// shorter one; with backtracking ("/a/{x}/c" still matches "/a/b/c" when "/a/b/d" exists). On one
// shape, a route for the exact method wins, then (for HEAD) the GET route, then the any-method
// route. A path that some route matches, but for no route answering the method, is
// kMethodNotAllowed with the Allow list of every method the matching routes answer.
//
// Security: a decoded '/' or NUL inside a segment (%2F, %00) makes the whole path kBadPath: an
// escaped slash never acts as a separator, nor hides inside a param or the wildcard. The router
// does not resolve "." / ".." segments; what serves files from a wildcard must (FileSpec does).
// TRACE, TRACK and CONNECT routes are refused at build time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "http/request.h"

namespace corral::http {

struct RouteDef {
  std::string pattern;
  size_t id = 0;  // what match() reports; the caller's index into its handlers
};

class Router {
 public:
  Router(Router&&) noexcept;
  Router& operator=(Router&&) noexcept;
  ~Router();

  // Builds the router, or an Error (code EINVAL) whose reason lists every problem, one per line,
  // each naming its pattern(s): syntax errors, conflicting patterns (same method, or both any
  // method, and the same shape: "GET /u/{id}" and "GET /u/{name}" conflict; "GET /a" and "/a" do
  // not), and TRACE/TRACK/CONNECT routes.
  static core::Result<Router> build(std::vector<RouteDef> defs);

  enum class MatchKind { kFound, kNotFound, kMethodNotAllowed, kBadPath };
  struct Match {
    MatchKind kind = MatchKind::kNotFound;
    size_t id = 0;             // kFound: the route's RouteDef::id
    std::string_view pattern;  // kFound: the route's pattern, stored in the router
    std::string allow;         // kMethodNotAllowed: "GET, HEAD, POST" (sorted; HEAD with GET)
  };

  // raw_path: the request path, still percent-encoded, starting with '/' (anything else is
  // kBadPath). `method_name` matters only for Method::kOther (a route "PROPFIND /x"). On kFound
  // fills req.params (names view the router's patterns: valid while the router lives),
  // req.wildcard (decoded) and req.pattern; otherwise leaves params and wildcard empty and
  // req.pattern "". kBadPath: some segment fails percent_decode_segment.
  Match match(Method method, std::string_view method_name, std::string_view raw_path,
              Request& req) const;

  size_t size() const;

 private:
  struct Impl;
  explicit Router(std::unique_ptr<Impl> impl);
  // Owned and heap-allocated so that the views handed out (param names, patterns) stay valid when
  // the Router is moved.
  std::unique_ptr<const Impl> impl_;
};

// One pattern in the router's syntax, matched on its own: decides whether a wrap (middleware)
// scoped by a pattern applies to a request. Without a method it applies to every method; "GET ..."
// also applies to HEAD, which the router serves with GET routes. A path the router would refuse as
// kBadPath matches no PathPattern (the request never reaches a route).
class PathPattern {
 public:
  // Error code EINVAL, reason naming the pattern and the problem. TRACE etc. are accepted here.
  static core::Result<PathPattern> parse(std::string_view pattern);

  bool matches(Method m, std::string_view raw_path) const {
    return matches(m, method_name(m), raw_path);
  }
  bool matches(Method m, std::string_view method_name, std::string_view raw_path) const;

  const std::string& pattern() const { return pattern_; }

 private:
  enum class Kind : uint8_t { kLiteral, kParam, kWildcard };
  struct Segment {
    Kind kind;
    std::string literal;  // decoded; kLiteral only
  };

  PathPattern() = default;

  std::string pattern_;
  bool any_method_ = true;
  Method method_ = Method::kOther;
  std::string method_name_;
  std::vector<Segment> segments_;
};

}  // namespace corral::http
