#include "http/site.h"

#include <exception>

namespace corral::http {

SiteBuilder& SiteBuilder::route(std::string pattern, Handler handler, RouteOptions options) {
  routes_.push_back({std::move(pattern), std::move(handler), options});
  return *this;
}

SiteBuilder& SiteBuilder::wrap(std::string pattern, Wrap wrap) {
  wraps_.emplace_back(std::move(pattern), std::move(wrap));
  return *this;
}

SiteBuilder& SiteBuilder::authenticate(Authenticator authenticator) {
  authenticators_.push_back(std::move(authenticator));
  return *this;
}

SiteBuilder& SiteBuilder::on_error(ErrorHook hook) {
  error_hooks_.push_back(std::move(hook));
  return *this;
}

core::Result<std::shared_ptr<const Site>> SiteBuilder::build() const {
  std::vector<RouteDef> defs;
  std::vector<Handler> handlers;
  std::vector<std::string> patterns;
  std::vector<RouteOptions> options;
  bool any_options = false;
  for (size_t i = 0; i < routes_.size(); ++i) {
    defs.push_back({routes_[i].pattern, i});
    handlers.push_back(routes_[i].handler);
    patterns.push_back(routes_[i].pattern);
    options.push_back(routes_[i].options);
    any_options = any_options || routes_[i].options.stream_body || routes_[i].options.max_body;
  }
  std::string problems;
  auto router = Router::build(std::move(defs));
  if (!router) problems = router.error().reason;
  std::vector<Site::ScopedWrap> wraps;
  for (const auto& [text, w] : wraps_) {
    auto p = PathPattern::parse(text);
    if (!p) {
      problems += (problems.empty() ? "" : "\n") + ("wrap '" + text + "': " + p.error().reason);
      continue;
    }
    wraps.push_back({std::move(p.value()), text, w});
  }
  if (!problems.empty()) return core::Error{EINVAL, problems};
  std::shared_ptr<Site> site(new Site(std::move(router.value()), std::move(handlers)));
  site->patterns_ = std::move(patterns);
  site->route_options_ = std::move(options);
  site->any_route_options_ = any_options;
  site->wraps_ = std::move(wraps);
  site->authenticators_ = authenticators_;
  site->error_hooks_ = error_hooks_;
  return std::shared_ptr<const Site>(std::move(site));
}

bool Site::has_route(std::string_view pattern) const {
  for (const auto& p : patterns_)
    if (p == pattern) return true;
  return false;
}

BodyRule Site::body_rule(Request& req, uint64_t default_max) const {
  if (!any_route_options_) return {default_max, false};
  auto m = router_.match(req.method, req.method_name, req.path, req);
  if (m.kind != Router::MatchKind::kFound) return {default_max, false};
  const RouteOptions& o = route_options_[m.id];
  return {o.max_body.value_or(default_max), o.stream_body};
}

Response Site::fail(Request& req, std::string_view pattern, std::string_view message) const {
  for (const auto& hook : error_hooks_) {
    try {
      hook(ErrorEvent{pattern, message, req});
    } catch (...) {
      // An error hook that throws must not turn a 500 into a crash.
    }
  }
  return Response::status_only(500);
}

Response Site::handle(Request& req) const {
  auto m = router_.match(req.method, req.method_name, req.path, req);
  switch (m.kind) {
    case Router::MatchKind::kBadPath:
      return Response::status_only(400);
    case Router::MatchKind::kNotFound:
      break;
    case Router::MatchKind::kMethodNotAllowed: {
      auto r = Response::status_only(405);
      r.header("Allow", std::move(m.allow));
      return r;
    }
    case Router::MatchKind::kFound:
      req.pattern = m.pattern;
      break;
  }
  try {
    for (const auto& auth : authenticators_) {
      if (auto p = auth(req)) {
        req.principal = std::move(p);
        break;
      }
    }
  } catch (const std::exception& e) {
    return fail(req, "authenticator", e.what());
  } catch (...) {
    return fail(req, "authenticator", "unknown exception");
  }
  return run(req, m);
}

Response Site::run(Request& req, const Router::Match& m) const {
  // Wraps are few; a small fixed array keeps the common path free of allocation.
  const ScopedWrap* active[32];
  size_t n = 0;
  for (const auto& w : wraps_)
    if (n < 32 && w.pattern.matches(req.method, req.path)) active[n++] = &w;

  std::string_view where = m.kind == Router::MatchKind::kFound ? m.pattern : std::string_view{};
  Response response;
  size_t entered = 0;
  try {
    bool answered = false;
    for (; entered < n && !answered; ++entered) {
      where = active[entered]->text;
      if (active[entered]->wrap.before) {
        if (auto r = active[entered]->wrap.before(req)) {
          response = std::move(*r);
          answered = true;
        }
      }
    }
    if (!answered) {
      if (m.kind == Router::MatchKind::kFound) {
        where = m.pattern;
        response = handlers_[m.id](req);
      } else {
        response = Response::status_only(404);
      }
    }
    while (entered > 0) {
      const auto& w = *active[--entered];
      where = w.text;
      if (w.wrap.after) w.wrap.after(req, response);
    }
  } catch (const std::exception& e) {
    return fail(req, where, e.what());
  } catch (...) {
    return fail(req, where, "unknown exception");
  }
  return response;
}

Response handle_request(const AdmissionPolicy& policy, const Site& site, Request& req,
                        const core::SocketAddress& peer) {
  auto a = admit(req, peer, policy);
  if (a.status) return Response::status_only(a.status);
  return site.handle(req);
}

}  // namespace corral::http
