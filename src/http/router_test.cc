#include "http/router.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

namespace corral::http {
namespace {

using Kind = Router::MatchKind;
using ::testing::HasSubstr;

// Builds a router whose route ids are the patterns' indices; fails the test on a build error.
Router make(const std::vector<std::string>& patterns) {
  std::vector<RouteDef> defs;
  for (size_t i = 0; i < patterns.size(); ++i) defs.push_back({patterns[i], i});
  auto r = Router::build(std::move(defs));
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().reason);
  if (!r.ok()) return Router::build({}).value();
  return std::move(r).value();
}

std::string build_error(const std::vector<std::string>& patterns) {
  std::vector<RouteDef> defs;
  for (size_t i = 0; i < patterns.size(); ++i) defs.push_back({patterns[i], i});
  auto r = Router::build(std::move(defs));
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.error().code, EINVAL);
  return r.error().reason;
}

size_t line_count(const std::string& s) {
  return s.empty() ? 0 : static_cast<size_t>(std::count(s.begin(), s.end(), '\n')) + 1;
}

Router::Match match(const Router& r, std::string_view method, std::string_view path, Request& req) {
  return r.match(parse_method(method), method, path, req);
}

// The pattern matched by `method path`, or "404", "405 <allow>", "400".
std::string route_of(const Router& r, std::string_view method, std::string_view path) {
  Request req;
  auto m = match(r, method, path, req);
  switch (m.kind) {
    case Kind::kFound:
      return std::string(m.pattern);
    case Kind::kNotFound:
      return "404";
    case Kind::kMethodNotAllowed:
      return "405 " + m.allow;
    case Kind::kBadPath:
      return "400";
  }
  return "?";
}

TEST(RouterTest, StaticRoutes) {
  Router r = make({"GET /", "GET /about", "GET /about/team", "POST /login"});
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(route_of(r, "GET", "/"), "GET /");
  EXPECT_EQ(route_of(r, "GET", "/about"), "GET /about");
  EXPECT_EQ(route_of(r, "GET", "/about/team"), "GET /about/team");
  EXPECT_EQ(route_of(r, "POST", "/login"), "POST /login");
  EXPECT_EQ(route_of(r, "GET", "/abou"), "404");
  EXPECT_EQ(route_of(r, "GET", "/aboutx"), "404");
  EXPECT_EQ(route_of(r, "GET", "/about/team/x"), "404");
  EXPECT_EQ(route_of(r, "GET", "/nothing"), "404");
}

TEST(RouterTest, ReportsTheCallersIdAndFillsRequest) {
  Router r = Router::build({{"GET /a/{x}", 42}, {"GET /b", 7}}).value();
  Request req;
  auto m = match(r, "GET", "/a/hello", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.id, 42u);
  EXPECT_EQ(m.pattern, "GET /a/{x}");
  EXPECT_EQ(req.pattern, "GET /a/{x}");
  EXPECT_EQ(req.param("x"), "hello");
  m = match(r, "GET", "/b", req);
  EXPECT_EQ(m.id, 7u);
  EXPECT_TRUE(req.params.empty());  // cleared from the previous match
  m = match(r, "GET", "/c", req);
  EXPECT_EQ(m.kind, Kind::kNotFound);
  EXPECT_EQ(req.pattern, "");
}

TEST(RouterTest, EmptyRouterFindsNothing) {
  Router r = make({});
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(route_of(r, "GET", "/"), "404");
}

TEST(RouterTest, ParamsAreDecodedAndNamed) {
  Router r = make({"GET /users/{user}/posts/{post_id}"});
  Request req;
  auto m = match(r, "GET", "/users/j%C3%B6rg/posts/a%20b+c", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  ASSERT_EQ(req.params.size(), 2u);
  EXPECT_EQ(req.params[0].name, "user");
  EXPECT_EQ(req.params[0].value, "j\xc3\xb6rg");
  EXPECT_EQ(req.params[1].name, "post_id");
  EXPECT_EQ(req.params[1].value, "a b+c");  // '+' stays '+' in a path
  EXPECT_EQ(req.param("post_id"), "a b+c");
}

TEST(RouterTest, ParamNeverMatchesAnEmptySegment) {
  Router r = make({"GET /u/{id}", "GET /u/{id}/x"});
  EXPECT_EQ(route_of(r, "GET", "/u/"), "404");
  EXPECT_EQ(route_of(r, "GET", "/u//x"), "404");
  EXPECT_EQ(route_of(r, "GET", "/u/1/x"), "GET /u/{id}/x");
}

TEST(RouterTest, LiteralsMatchTheDecodedSegment) {
  Router r = make({"GET /abc", "GET /caf%C3%A9", "GET /a%20b"});
  EXPECT_EQ(route_of(r, "GET", "/%61bc"), "GET /abc");
  EXPECT_EQ(route_of(r, "GET", "/%61%62%63"), "GET /abc");
  EXPECT_EQ(route_of(r, "GET", "/caf%c3%a9"), "GET /caf%C3%A9");
  EXPECT_EQ(route_of(r, "GET", "/caf\xc3\xa9"), "GET /caf%C3%A9");
  EXPECT_EQ(route_of(r, "GET", "/a%20b"), "GET /a%20b");
  EXPECT_EQ(route_of(r, "GET", "/a+b"), "404");
  EXPECT_EQ(route_of(r, "GET", "/ABC"), "404");  // paths are case-sensitive
}

TEST(RouterTest, ManyLiteralSiblingsAreSearchedCorrectly) {
  std::vector<std::string> patterns;
  for (int i = 0; i < 200; ++i) patterns.push_back("GET /p" + std::to_string(i));
  patterns.push_back("GET /\xc3\xa9t\xc3\xa9");  // not a pchar: refused...
  EXPECT_FALSE(Router::build({{patterns.back(), 0}}).ok());
  patterns.back() = "GET /%C3%A9t%C3%A9";  // ...but escaped it sorts after ASCII (unsigned bytes)
  patterns.push_back("GET /z");
  Router r = make(patterns);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(route_of(r, "GET", "/p" + std::to_string(i)), "GET /p" + std::to_string(i));
  }
  EXPECT_EQ(route_of(r, "GET", "/%c3%a9t%c3%a9"), "GET /%C3%A9t%C3%A9");
  EXPECT_EQ(route_of(r, "GET", "/z"), "GET /z");
  EXPECT_EQ(route_of(r, "GET", "/p200"), "404");
  EXPECT_EQ(route_of(r, "GET", "/p"), "404");
}

TEST(RouterTest, PrecedenceLiteralThenParamThenWildcard) {
  Router r = make({"GET /a/*", "GET /a/{x}", "GET /a/b"});  // declaration order is irrelevant
  EXPECT_EQ(route_of(r, "GET", "/a/b"), "GET /a/b");
  EXPECT_EQ(route_of(r, "GET", "/a/c"), "GET /a/{x}");
  EXPECT_EQ(route_of(r, "GET", "/a/c/d"), "GET /a/*");
  EXPECT_EQ(route_of(r, "GET", "/a/"), "GET /a/*");  // a param never takes an empty segment
  EXPECT_EQ(route_of(r, "GET", "/a"), "GET /a/*");
}

TEST(RouterTest, BacktracksFromLiteralToParam) {
  Router r = make({"GET /a/{x}/c", "GET /a/b/d"});
  Request req;
  auto m = match(r, "GET", "/a/b/c", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "GET /a/{x}/c");
  ASSERT_EQ(req.params.size(), 1u);
  EXPECT_EQ(req.params[0].name, "x");
  EXPECT_EQ(req.params[0].value, "b");
  EXPECT_EQ(route_of(r, "GET", "/a/b/d"), "GET /a/b/d");
  EXPECT_EQ(route_of(r, "GET", "/a/z/d"), "404");
}

TEST(RouterTest, BacktracksToAShorterWildcardAndDropsParams) {
  Router r = make({"GET /a/{x}/{y}/end", "GET /a/*"});
  Request req;
  auto m = match(r, "GET", "/a/1/2/not-end", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "GET /a/*");
  EXPECT_TRUE(req.params.empty());  // the params of the abandoned branch are gone
  EXPECT_EQ(req.wildcard, "1/2/not-end");
  m = match(r, "GET", "/a/1/2/end", req);
  EXPECT_EQ(m.pattern, "GET /a/{x}/{y}/end");
  EXPECT_EQ(req.param("x"), "1");
  EXPECT_EQ(req.param("y"), "2");
  EXPECT_EQ(req.wildcard, "");
}

TEST(RouterTest, BacktracksAcrossSeveralLevels) {
  Router r = make({"GET /{a}/{b}/{c}", "GET /x/y/z/w", "GET /x/{b}/z/w", "GET /x/y/{c}/q"});
  EXPECT_EQ(route_of(r, "GET", "/x/y/z"), "GET /{a}/{b}/{c}");
  EXPECT_EQ(route_of(r, "GET", "/x/y/z/w"), "GET /x/y/z/w");
  EXPECT_EQ(route_of(r, "GET", "/x/k/z/w"), "GET /x/{b}/z/w");
  EXPECT_EQ(route_of(r, "GET", "/x/y/k/q"), "GET /x/y/{c}/q");
  EXPECT_EQ(route_of(r, "GET", "/x/y/z/q"), "GET /x/y/{c}/q");
  EXPECT_EQ(route_of(r, "GET", "/x/y/k/w"), "404");
}

TEST(RouterTest, WildcardMatchesZeroOrMoreSegments) {
  Router r = make({"GET /static/*"});
  Request req;
  auto m = match(r, "GET", "/static", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.wildcard, "");
  m = match(r, "GET", "/static/", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.wildcard, "");
  m = match(r, "GET", "/static/a/b", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.wildcard, "a/b");
  m = match(r, "GET", "/static/a%20b/c%25d/", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.wildcard, "a b/c%d/");  // decoded per segment, trailing slash kept
  EXPECT_EQ(route_of(r, "GET", "/staticx"), "404");
  EXPECT_EQ(route_of(r, "GET", "/stati"), "404");
}

TEST(RouterTest, WildcardWithParamsBeforeIt) {
  Router r = make({"GET /repo/{owner}/{name}/blob/*"});
  Request req;
  auto m = match(r, "GET", "/repo/me/corral/blob/src/http/router.cc", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.param("owner"), "me");
  EXPECT_EQ(req.param("name"), "corral");
  EXPECT_EQ(req.wildcard, "src/http/router.cc");
}

TEST(RouterTest, LongestWildcardPrefixFirst) {
  Router r = make({"GET /static/*", "GET /static/img/*", "GET /*"});
  Request req;
  auto m = match(r, "GET", "/static/img/logo.png", req);
  EXPECT_EQ(m.pattern, "GET /static/img/*");
  EXPECT_EQ(req.wildcard, "logo.png");
  m = match(r, "GET", "/static/img", req);
  EXPECT_EQ(m.pattern, "GET /static/img/*");
  EXPECT_EQ(req.wildcard, "");
  m = match(r, "GET", "/static/imgs/x", req);
  EXPECT_EQ(m.pattern, "GET /static/*");
  EXPECT_EQ(req.wildcard, "imgs/x");
  m = match(r, "GET", "/static/css/site.css", req);
  EXPECT_EQ(m.pattern, "GET /static/*");
  EXPECT_EQ(req.wildcard, "css/site.css");
  m = match(r, "GET", "/other/x", req);
  EXPECT_EQ(m.pattern, "GET /*");
  EXPECT_EQ(req.wildcard, "other/x");
}

TEST(RouterTest, RootPatterns) {
  Router r = make({"GET /", "GET /*"});
  Request req;
  EXPECT_EQ(match(r, "GET", "/", req).pattern, "GET /");
  auto m = match(r, "GET", "/x", req);
  EXPECT_EQ(m.pattern, "GET /*");
  EXPECT_EQ(req.wildcard, "x");
  Router only_wild = make({"GET /*"});
  m = match(only_wild, "GET", "/", req);
  EXPECT_EQ(m.pattern, "GET /*");
  EXPECT_EQ(req.wildcard, "");
}

// "/a/" and "/a" are distinct paths: neither route matches the other's request.
TEST(RouterTest, TrailingSlashIsDistinct) {
  Router only_bare = make({"GET /a"});
  EXPECT_EQ(route_of(only_bare, "GET", "/a/"), "404");
  Router only_slash = make({"GET /a/"});
  EXPECT_EQ(route_of(only_slash, "GET", "/a"), "404");
  EXPECT_EQ(route_of(only_slash, "GET", "/a/"), "GET /a/");
  Router both = make({"GET /a", "GET /a/", "GET /u/{id}/"});
  EXPECT_EQ(route_of(both, "GET", "/a"), "GET /a");
  EXPECT_EQ(route_of(both, "GET", "/a/"), "GET /a/");
  EXPECT_EQ(route_of(both, "GET", "/u/1/"), "GET /u/{id}/");
  EXPECT_EQ(route_of(both, "GET", "/u/1"), "404");
}

TEST(RouterTest, EmptySegmentsInRequests) {
  Router r = make({"GET /a/b", "GET /a/{x}/b", "GET /w/*"});
  EXPECT_EQ(route_of(r, "GET", "/a//b"), "404");
  EXPECT_EQ(route_of(r, "GET", "//a/b"), "404");
  EXPECT_EQ(route_of(r, "GET", "/a/b//"), "404");
  Request req;
  auto m = match(r, "GET", "/w//b", req);  // the wildcard takes the rest as it is
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.wildcard, "/b");
}

TEST(RouterTest, EncodedSlashIsNeverASeparator) {
  // A decoded '/' inside a segment is refused outright (400), for params and wildcards alike: it
  // can neither split a segment nor hide inside a value ("a/../b" past a segment-wise check).
  Router r = make({"GET /files/{name}", "GET /static/*", "GET /a/b"});
  EXPECT_EQ(route_of(r, "GET", "/files/a%2Fb"), "400");
  EXPECT_EQ(route_of(r, "GET", "/files/a%2fb"), "400");
  EXPECT_EQ(route_of(r, "GET", "/static/a%2Fb"), "400");
  EXPECT_EQ(route_of(r, "GET", "/static/..%2F..%2Fetc"), "400");
  EXPECT_EQ(route_of(r, "GET", "/a%2Fb"), "400");  // not "/a/b"
  EXPECT_EQ(route_of(r, "GET", "/files/a%2Cb"), "GET /files/{name}");
}

TEST(RouterTest, BadPaths) {
  Router r = make({"GET /*"});
  Request req;
  req.params.push_back({"stale", "x"});
  req.wildcard = "stale";
  auto m = match(r, "GET", "/a%00b", req);
  EXPECT_EQ(m.kind, Kind::kBadPath);
  EXPECT_TRUE(req.params.empty());
  EXPECT_TRUE(req.wildcard.empty());
  EXPECT_EQ(route_of(r, "GET", "/a%zz"), "400");
  EXPECT_EQ(route_of(r, "GET", "/a%"), "400");
  EXPECT_EQ(route_of(r, "GET", "/a%4"), "400");
  EXPECT_EQ(route_of(r, "GET", ""), "400");
  EXPECT_EQ(route_of(r, "GET", "*"), "400");
  EXPECT_EQ(route_of(r, "GET", "a/b"), "400");
  EXPECT_EQ(route_of(r, "GET", "http://h/a"), "400");
  // A bad escape anywhere is a bad path, even where no route could match.
  Router none = make({"GET /x"});
  EXPECT_EQ(route_of(none, "GET", "/y/%G0"), "400");
}

TEST(RouterTest, MethodNotAllowedListsTheAllowedMethods) {
  Router r = make({"GET /a", "POST /a", "DELETE /a", "PUT /b"});
  Request req;
  auto m = match(r, "PATCH", "/a", req);
  EXPECT_EQ(m.kind, Kind::kMethodNotAllowed);
  EXPECT_EQ(m.allow, "DELETE, GET, HEAD, POST");
  EXPECT_EQ(route_of(r, "GET", "/b"), "405 PUT");
  EXPECT_EQ(route_of(r, "HEAD", "/b"), "405 PUT");
  EXPECT_EQ(route_of(r, "PUT", "/c"), "404");
}

TEST(RouterTest, MethodNotAllowedUnitesEveryMatchingShape) {
  Router r = make({"GET /a/b", "PUT /a/{x}", "OPTIONS /a/*", "POST /a/c"});
  EXPECT_EQ(route_of(r, "DELETE", "/a/b"), "405 GET, HEAD, OPTIONS, PUT");
  EXPECT_EQ(route_of(r, "DELETE", "/a/c"), "405 OPTIONS, POST, PUT");
  EXPECT_EQ(route_of(r, "DELETE", "/a/z/y"), "405 OPTIONS");
}

TEST(RouterTest, MethodFallsThroughToALessSpecificShape) {
  Router r = make({"GET /a/b", "POST /a/{x}", "DELETE /a/*"});
  Request req;
  auto m = match(r, "POST", "/a/b", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "POST /a/{x}");
  EXPECT_EQ(req.param("x"), "b");
  m = match(r, "DELETE", "/a/b", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "DELETE /a/*");
  EXPECT_TRUE(req.params.empty());
  EXPECT_EQ(req.wildcard, "b");
}

TEST(RouterTest, HeadUsesGetUnlessThereIsAHeadRoute) {
  Router r = make({"GET /a", "GET /b", "HEAD /b", "POST /c"});
  EXPECT_EQ(route_of(r, "HEAD", "/a"), "GET /a");
  EXPECT_EQ(route_of(r, "HEAD", "/b"), "HEAD /b");
  EXPECT_EQ(route_of(r, "GET", "/b"), "GET /b");
  EXPECT_EQ(route_of(r, "HEAD", "/c"), "405 POST");
  Router head_only = make({"HEAD /h"});
  EXPECT_EQ(route_of(head_only, "GET", "/h"), "405 HEAD");
}

TEST(RouterTest, AnyMethodRoutes) {
  Router r = make({"/any", "GET /mixed", "/mixed", "POST /p/{x}", "/p/*"});
  for (std::string_view m : {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "MKCOL"})
    EXPECT_EQ(route_of(r, m, "/any"), "/any") << m;
  // The method-specific route wins on the same shape (HEAD included, through GET).
  EXPECT_EQ(route_of(r, "GET", "/mixed"), "GET /mixed");
  EXPECT_EQ(route_of(r, "HEAD", "/mixed"), "GET /mixed");
  EXPECT_EQ(route_of(r, "POST", "/mixed"), "/mixed");
  // An any-method route on a less specific shape still catches what the specific one doesn't.
  EXPECT_EQ(route_of(r, "POST", "/p/1"), "POST /p/{x}");
  EXPECT_EQ(route_of(r, "GET", "/p/1"), "/p/*");
}

TEST(RouterTest, ExtensionMethods) {
  Router r = make({"PROPFIND /dav/{x}", "MKCOL /dav/{x}"});
  Request req;
  auto m = r.match(Method::kOther, "PROPFIND", "/dav/f", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "PROPFIND /dav/{x}");
  m = r.match(Method::kOther, "MKCOL", "/dav/f", req);
  EXPECT_EQ(m.pattern, "MKCOL /dav/{x}");
  m = r.match(Method::kOther, "LOCK", "/dav/f", req);
  EXPECT_EQ(m.kind, Kind::kMethodNotAllowed);
  EXPECT_EQ(m.allow, "MKCOL, PROPFIND");
  EXPECT_EQ(route_of(r, "GET", "/dav/f"), "405 MKCOL, PROPFIND");
}

TEST(RouterTest, ValidPatterns) {
  for (std::string p : {"/", "/a/", "/{x}/", "/*", "GET /a/{id}/*", "PROPFIND /x", "/a%20b",
                        "/a:b@c;d=e,f!$&'()+~._-", "GET /{_x1}/{Y}"}) {
    auto r = Router::build({{p, 0}});
    EXPECT_TRUE(r.ok()) << p << ": " << (r.ok() ? "" : r.error().reason);
  }
}

TEST(RouterTest, SyntaxErrors) {
  struct Case {
    std::string pattern;
    std::string problem;
  };
  std::vector<Case> cases = {
      {"/a/{", "must be a whole segment"},
      {"/a/x}", "must be a whole segment"},
      {"/a/{x}y", "must be a whole segment"},
      {"/a/{x}{y}", "must be a whole segment"},
      {"/a/b{x}", "must be a whole segment"},
      {"/a/b*", "must be whole segments"},
      {"/a/*/b", "'*' must be the last segment"},
      {"/*/", "'*' must be the last segment"},
      {"no-slash", "must start with '/'"},
      {"GET  /a", "must start with '/'"},
      {"GET a", "must start with '/'"},
      {"", "empty pattern"},
      {"get /a", "uppercase token"},
      {"G?T /a", "uppercase token"},
      {"/a/{1x}", "not an identifier"},
      {"/a/{}", "not an identifier"},
      {"/a/{x-y}", "not an identifier"},
      {"/{x}/{x}", "used twice"},
      {"/a//b", "empty segment 2"},
      {"//", "empty segment 1"},
      {"/a?b", "'?' is not allowed"},
      {"/a b", "byte 0x20 is not allowed"},
      {"/a#b", "'#' is not allowed"},
      {"/\xc3\xa9", "byte 0xC3 is not allowed"},
      {"/a/%zz", "bad percent-escape"},
      {"/a/%2F", "bad percent-escape"},
      {"/a/%00", "bad percent-escape"},
  };
  for (const auto& c : cases) {
    std::string reason = build_error({c.pattern});
    EXPECT_THAT(reason, HasSubstr(c.problem)) << c.pattern;
    EXPECT_THAT(reason, HasSubstr("\"" + c.pattern + "\"")) << c.pattern;
    auto p = PathPattern::parse(c.pattern);
    EXPECT_FALSE(p.ok()) << c.pattern;
  }
}

TEST(RouterTest, ConflictsAreReported) {
  EXPECT_THAT(build_error({"GET /u/{id}", "GET /u/{name}"}),
              HasSubstr("routes \"GET /u/{id}\" and \"GET /u/{name}\" conflict"));
  EXPECT_THAT(build_error({"GET /a", "GET /a"}), HasSubstr("conflict"));
  EXPECT_THAT(build_error({"/a", "/a"}), HasSubstr("both for any method"));
  EXPECT_THAT(build_error({"GET /s/*", "GET /s/*"}), HasSubstr("conflict"));
  EXPECT_THAT(build_error({"GET /ab", "GET /a%62"}), HasSubstr("conflict"));  // decoded equal
  EXPECT_THAT(build_error({"PROPFIND /x", "PROPFIND /x"}), HasSubstr("conflict"));
  // Not conflicts: different methods, method vs any, trailing slash, wildcard vs exact path.
  EXPECT_TRUE(Router::build({{"GET /a", 0},
                             {"/a", 1},
                             {"POST /a", 2},
                             {"GET /a/", 3},
                             {"GET /a/*", 4},
                             {"GET /{x}", 5},
                             {"PROPFIND /a", 6},
                             {"MKCOL /a", 7},
                             {"HEAD /a", 8}})
                  .ok());
}

TEST(RouterTest, TraceTrackConnectAreRefused) {
  std::string reason = build_error({"TRACE /x", "TRACK /y", "CONNECT /z", "GET /ok"});
  EXPECT_THAT(reason, HasSubstr("TRACE routes are refused: \"TRACE /x\""));
  EXPECT_THAT(reason, HasSubstr("TRACK routes are refused: \"TRACK /y\""));
  EXPECT_THAT(reason, HasSubstr("CONNECT routes are refused: \"CONNECT /z\""));
  EXPECT_EQ(line_count(reason), 3u);
}

TEST(RouterTest, EveryProblemIsReportedOncePerLine) {
  std::string reason = build_error({
      "GET /ok",
      "/a/{",            // syntax
      "no-slash",        // syntax
      "/a/*/b",          // syntax
      "/a/{1x}",         // syntax
      "GET /u/{id}",     //
      "GET /u/{name}",   // conflict
      "TRACE /t",        // refused
      "GET /ok",         // conflict
      "/a/{x}/{x}/{1}",  // two problems in one pattern
  });
  EXPECT_EQ(line_count(reason), 9u) << reason;
  for (std::string_view p : {"\"/a/{\"", "\"no-slash\"", "\"/a/*/b\"", "\"/a/{1x}\"",
                             "\"GET /u/{name}\"", "\"TRACE /t\"", "\"GET /ok\" and \"GET /ok\""})
    EXPECT_THAT(reason, HasSubstr(std::string(p)));
}

TEST(RouterTest, RequestBuffersAreReused) {
  Router r = make({"GET /x/{a}/{b}/{c}/*"});
  Request req;
  auto m = match(r, "GET", "/x/1/2/3/a-long-enough-wildcard-value-to-be-on-the-heap", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  const size_t params_capacity = req.params.capacity();
  const size_t wildcard_capacity = req.wildcard.capacity();
  m = match(r, "GET", "/x/4/5/6/short", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(req.param("a"), "4");
  EXPECT_EQ(req.wildcard, "short");
  EXPECT_EQ(req.params.capacity(), params_capacity);
  EXPECT_EQ(req.wildcard.capacity(), wildcard_capacity);
}

TEST(RouterTest, ViewsSurviveMovingTheRouter) {
  // Short patterns would live inside std::string's small buffer; the router keeps its own copy.
  Router a = make({"GET /{i}", "/{j}/k"});
  Router b = std::move(a);
  Router c = make({});
  c = std::move(b);
  Request req;
  auto m = match(c, "GET", "/v", req);
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.pattern, "GET /{i}");
  EXPECT_EQ(req.params.at(0).name, "i");
  m = match(c, "POST", "/v/k", req);
  EXPECT_EQ(m.pattern, "/{j}/k");
  EXPECT_EQ(req.params.at(0).name, "j");
}

TEST(RouterTest, ParamsAndPatternsViewTheRouterNotTheDefs) {
  std::vector<RouteDef> defs = {{"GET /p/{name}", 1}};
  Router r = Router::build(defs).value();
  defs.clear();
  Request req;
  auto m = match(r, "GET", "/p/v", req);
  EXPECT_EQ(m.pattern, "GET /p/{name}");
  EXPECT_EQ(req.params.at(0).name, "name");
}

// ---------------------------------------------------------------------------------------------
// PathPattern

PathPattern pattern(std::string_view p) {
  auto r = PathPattern::parse(p);
  EXPECT_TRUE(r.ok()) << p;
  return std::move(r).value();
}

TEST(PathPatternTest, LiteralParamWildcard) {
  PathPattern p = pattern("/admin/*");
  EXPECT_EQ(p.pattern(), "/admin/*");
  EXPECT_TRUE(p.matches(Method::kGet, "/admin"));
  EXPECT_TRUE(p.matches(Method::kPost, "/admin/"));
  EXPECT_TRUE(p.matches(Method::kDelete, "/admin/users/1"));
  EXPECT_TRUE(p.matches(Method::kGet, "/%61dmin/x"));  // literals match decoded segments
  EXPECT_FALSE(p.matches(Method::kGet, "/administrator"));
  EXPECT_FALSE(p.matches(Method::kGet, "/"));

  PathPattern q = pattern("/u/{id}/edit");
  EXPECT_TRUE(q.matches(Method::kGet, "/u/7/edit"));
  EXPECT_FALSE(q.matches(Method::kGet, "/u//edit"));
  EXPECT_FALSE(q.matches(Method::kGet, "/u/7/edit/"));
  EXPECT_FALSE(q.matches(Method::kGet, "/u/7"));
  EXPECT_FALSE(q.matches(Method::kGet, "/u/7/edit/x"));

  PathPattern root = pattern("/");
  EXPECT_TRUE(root.matches(Method::kGet, "/"));
  EXPECT_FALSE(root.matches(Method::kGet, "/a"));
  EXPECT_TRUE(pattern("/*").matches(Method::kGet, "/"));
}

TEST(PathPatternTest, Methods) {
  PathPattern get = pattern("GET /a");
  EXPECT_TRUE(get.matches(Method::kGet, "/a"));
  EXPECT_TRUE(get.matches(Method::kHead, "/a"));  // HEAD is served by GET routes
  EXPECT_FALSE(get.matches(Method::kPost, "/a"));
  PathPattern post = pattern("POST /a");
  EXPECT_FALSE(post.matches(Method::kHead, "/a"));
  PathPattern dav = pattern("PROPFIND /a");
  EXPECT_TRUE(dav.matches(Method::kOther, "PROPFIND", "/a"));
  EXPECT_FALSE(dav.matches(Method::kOther, "MKCOL", "/a"));
  EXPECT_FALSE(dav.matches(Method::kOther, "/a"));
  PathPattern any = pattern("/a");
  EXPECT_TRUE(any.matches(Method::kOther, "MKCOL", "/a"));
  EXPECT_TRUE(any.matches(Method::kPatch, "/a"));
  EXPECT_TRUE(pattern("TRACE /a").matches(Method::kTrace, "/a"));  // a scope, not a route
}

TEST(PathPatternTest, BadPathsNeverMatch) {
  PathPattern p = pattern("/*");
  EXPECT_FALSE(p.matches(Method::kGet, "/a%2Fb"));
  EXPECT_FALSE(p.matches(Method::kGet, "/%00"));
  EXPECT_FALSE(p.matches(Method::kGet, "/%zz"));
  EXPECT_FALSE(p.matches(Method::kGet, ""));
  EXPECT_FALSE(p.matches(Method::kGet, "*"));
}

TEST(PathPatternTest, AgreesWithTheRouter) {
  const std::vector<std::string> patterns = {"/",    "/a",       "/a/", "/a/{x}", "/a/{x}/c",
                                             "/a/*", "/b/{x}/*", "/*",  "/c%20d", "/e/f/"};
  const std::vector<std::string> paths = {"/",    "/a",    "/a/",    "/a/b",   "/a/b/c",  "/a//c",
                                          "/b",   "/b/1",  "/b/1/",  "/b/1/z", "/c d",    "/c%20d",
                                          "/e/f", "/e/f/", "/e/f//", "/zz/y",  "/a/b%2Fc"};
  for (const auto& p : patterns) {
    Router r = make({p});
    PathPattern pp = pattern(p);
    for (const auto& path : paths) {
      Request req;
      bool routed = r.match(Method::kGet, "GET", path, req).kind == Kind::kFound;
      EXPECT_EQ(pp.matches(Method::kGet, path), routed) << p << " vs " << path;
    }
  }
}

}  // namespace
}  // namespace corral::http
