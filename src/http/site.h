// Site: the core of corral as a function from a Request to a Response description. It owns the
// routes, the wraps (middleware) and the authenticators of an application, and is immutable once
// built: replacing it at runtime means publishing a new Site, while a request in flight keeps the
// one it started on (connections hold a shared_ptr for as long as a response is being produced).
//
// handle() runs, in order: the authenticators (the first that returns a principal wins; none is
// fine: the request stays anonymous), the wraps whose pattern matches (their `before` in
// registration order, any of which may answer instead of the route; their `after` in reverse
// order, onion-style), and the route. A throwing route or wrap becomes a generic 500 and an
// on_error event naming the pattern and the error; no exception text reaches the client.
//
// The admission baseline (admission.h) is not part of handle(): it runs before it, in the
// connection, and in handle_request() below for in-process callers.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "http/admission.h"
#include "http/body_stream.h"
#include "http/request.h"
#include "http/response.h"
#include "http/router.h"

namespace corral::http {

using Handler = std::function<Response(Request&)>;
using Authenticator = std::function<std::optional<Principal>(const Request&)>;

// How a route takes its request body. The default: buffered whole (Request::body) under the
// server's limits.max_body, the route running once it is complete.
struct RouteOptions {
  // The route runs once the head is parsed and reads the body in pieces through
  // Request::body_stream (body_stream.h), with backpressure. HTTP/1.1 only: over HTTP/3 (and
  // in-process calls) the body is still whole in Request::body.
  bool stream_body = false;
  // This route's body limit instead of the server's: a Content-Length above it is 413 at once, a
  // chunked body passing it is cut (413 if nothing was answered yet, else the connection closes).
  std::optional<uint64_t> max_body;
};

struct Wrap {
  // Runs before the route; returning a response answers the request without the route.
  std::function<std::optional<Response>(Request&)> before;
  // Runs after the route (or after a `before` that answered); may edit the response.
  std::function<void(Request&, Response&)> after;
};

struct ErrorEvent {
  std::string_view pattern;  // the route or wrap pattern that threw
  std::string_view message;  // the exception's what(); for logs only
  const Request& request;
};
using ErrorHook = std::function<void(const ErrorEvent&)>;

class Site {
 public:
  // The core function: a request (already admitted) to a response description.
  Response handle(Request& req) const;
  size_t route_count() const { return router_.size(); }
  // Whether a route with exactly this pattern text exists (an upgraded socket asks after a swap).
  bool has_route(std::string_view pattern) const;
  // The body rule of the route `req` goes to (`default_max`, buffered, for a route without
  // options or no route). Matches the route (filling req.params, which handle() fills again): the
  // connection asks only for requests that have a body, and only when some route has options.
  BodyRule body_rule(Request& req, uint64_t default_max) const;

 private:
  friend class SiteBuilder;
  struct ScopedWrap {
    PathPattern pattern;
    std::string text;
    Wrap wrap;
  };
  Site(Router router, std::vector<Handler> handlers)
      : router_(std::move(router)), handlers_(std::move(handlers)) {}
  Response run(Request& req, const Router::Match& m) const;
  Response fail(Request& req, std::string_view pattern, std::string_view message) const;

  Router router_;
  std::vector<Handler> handlers_;
  std::vector<RouteOptions> route_options_;  // by route id
  bool any_route_options_ = false;
  std::vector<std::string> patterns_;
  std::vector<ScopedWrap> wraps_;
  std::vector<Authenticator> authenticators_;
  std::vector<ErrorHook> error_hooks_;
};

class SiteBuilder {
 public:
  SiteBuilder& route(std::string pattern, Handler handler, RouteOptions options = {});
  SiteBuilder& wrap(std::string pattern, Wrap wrap);
  SiteBuilder& authenticate(Authenticator authenticator);
  SiteBuilder& on_error(ErrorHook hook);
  // Validates every pattern; the error lists each problem (conflicts, syntax, refused methods).
  core::Result<std::shared_ptr<const Site>> build() const;

 private:
  struct RouteEntry {
    std::string pattern;
    Handler handler;
    RouteOptions options;
  };
  std::vector<RouteEntry> routes_;
  std::vector<std::pair<std::string, Wrap>> wraps_;
  std::vector<Authenticator> authenticators_;
  std::vector<ErrorHook> error_hooks_;
};

// Admission, then the site: what a connection does with a parsed request, without a socket.
// `peer` is the client's address (a loopback address for tests).
Response handle_request(const AdmissionPolicy& policy, const Site& site, Request& req,
                        const core::SocketAddress& peer);

}  // namespace corral::http
