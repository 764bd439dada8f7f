// Fuzzes the router's matcher: a fixed router with literals, {params}, wildcards, a method-less
// route, an escaped literal and an extension method; byte 0 picks the method, the rest is the raw
// request path (copied to its own heap buffer so AddressSanitizer catches reads past it).
//
// Invariants: a path not starting with '/' is kBadPath; kFound names a route of the table, and its
// params are non-empty and never contain '/' or NUL (a decoded %2F or %00 must make the path
// kBadPath, never hide inside a segment), and the route's own PathPattern agrees that it matches;
// kMethodNotAllowed has an Allow list; anything but kFound leaves params, wildcard and pattern
// empty.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "http/router.h"

namespace {

using corral::http::Method;
using corral::http::PathPattern;
using corral::http::Request;
using corral::http::RouteDef;
using corral::http::Router;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

const std::vector<std::string>& patterns() {
  static const std::vector<std::string> p = {
      "GET /",
      "GET /users/{id}",
      "POST /users/{id}",
      "GET /users/{id}/posts/{post}",
      "GET /users/me",
      "/static/*",
      "GET /a/b/c",
      "GET /a/{x}/d",
      "GET /a/b/*",
      "PUT /files/*",
      "DELETE /items/{item}",
      "GET /a%20b",
      "GET /trailing/",
      "PROPFIND /dav/*",
      "GET /{lang}/docs/{page}",
  };
  return p;
}

const Router& router() {
  static const Router r = [] {
    std::vector<RouteDef> defs;
    for (size_t i = 0; i < patterns().size(); ++i) defs.push_back({patterns()[i], i});
    auto built = Router::build(std::move(defs));
    check(built.ok());
    return std::move(built).value();
  }();
  return r;
}

const std::vector<PathPattern>& path_patterns() {
  static const std::vector<PathPattern> p = [] {
    std::vector<PathPattern> out;
    for (const auto& s : patterns()) {
      auto parsed = PathPattern::parse(s);
      check(parsed.ok());
      out.push_back(std::move(parsed).value());
    }
    return out;
  }();
  return p;
}

struct MethodChoice {
  Method method;
  std::string_view name;
};
constexpr MethodChoice kMethods[] = {
    {Method::kGet, "GET"},         {Method::kHead, "HEAD"},      {Method::kPost, "POST"},
    {Method::kPut, "PUT"},         {Method::kDelete, "DELETE"},  {Method::kPatch, "PATCH"},
    {Method::kOptions, "OPTIONS"}, {Method::kOther, "PROPFIND"}, {Method::kOther, "MKCOL"},
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const MethodChoice& m = kMethods[data[0] % std::size(kMethods)];
  const size_t len = size - 1;
  std::unique_ptr<char[]> buf(new char[len ? len : 1]);
  std::memcpy(buf.get(), data + 1, len);
  std::string_view path(buf.get(), len);

  Request req;
  auto match = router().match(m.method, m.name, path, req);
  if (path.empty() || path[0] != '/') check(match.kind == Router::MatchKind::kBadPath);
  switch (match.kind) {
    case Router::MatchKind::kFound: {
      check(match.id < patterns().size());
      check(match.pattern == patterns()[match.id]);
      check(req.pattern == match.pattern);
      for (const auto& p : req.params) {
        check(!p.name.empty());
        check(!p.value.empty());
        check(p.value.find('/') == std::string::npos);
        check(p.value.find('\0') == std::string::npos);
      }
      check(req.wildcard.find('\0') == std::string::npos);
      check(path_patterns()[match.id].matches(m.method, m.name, path));
      break;
    }
    case Router::MatchKind::kMethodNotAllowed:
      check(!match.allow.empty());
      [[fallthrough]];
    case Router::MatchKind::kNotFound:
    case Router::MatchKind::kBadPath:
      check(req.params.empty());
      check(req.wildcard.empty());
      check(req.pattern.empty());
      break;
  }
  // A path the router refuses as bad matches no wrap pattern either.
  if (match.kind == Router::MatchKind::kBadPath) {
    for (const auto& p : path_patterns()) check(!p.matches(m.method, m.name, path));
  }
  return 0;
}
