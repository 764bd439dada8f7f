// The Manager's configuration: the options' validation (kinds, commands, route patterns in the
// HTTP router's own syntax), the state directory, and address_for on the same router the
// proxy routes use (http::Router): one matcher for a kind's paths.
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "core/escape.h"
#include "http/percent.h"
#include "http/router.h"
#include "workers/launcher.h"
#include "workers/manager_impl.h"

namespace corral::workers {

using namespace detail;

namespace {

core::Result<void> make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) < 0 && errno != EEXIST) return core::errno_error(path.c_str());
  struct stat st;
  if (::stat(path.c_str(), &st) < 0) return core::errno_error(path.c_str());
  if (!S_ISDIR(st.st_mode)) return core::Error{ENOTDIR, path + " is not a directory"};
  ::chmod(path.c_str(), mode);
  return {};
}

// A kind's route pattern: the router's syntax (http::PathPattern says what it refuses), any method
// (the proxy route answers every method), and at least one {param} for the address's key. After
// the router's own validation a '{' can only open a {param}: a literal cannot hold one.
core::Result<void> check_route(const std::string& kind, const std::string& pattern) {
  std::string where = "workers." + kind + ".routes: \"" + pattern + "\"";
  if (pattern.empty() || pattern[0] != '/')
    return core::Error{EINVAL, where + " must start with '/' (a kind's routes answer any method)"};
  if (auto p = http::PathPattern::parse(pattern); !p)
    return core::Error{EINVAL, where + ": " + p.error().reason};
  if (pattern.find('{') == std::string::npos)
    return core::Error{EINVAL, where + " has no {param} to make the address's key"};
  return {};
}

core::Result<void> check_kind(const KindConfig& cfg, const std::vector<KindConfig>& before) {
  const std::string& name = cfg.name;
  if (name.empty() || name.find_first_of(":/%") != std::string::npos)
    return core::Error{EINVAL,
                       "workers." + name + ": a kind name is non-empty, without ':', '/', '%'"};
  for (const auto& k : before)
    if (k.name == name) return core::Error{EINVAL, "workers." + name + ": defined twice"};
  if (cfg.command.empty() && !cfg.in_process)
    return core::Error{EINVAL, "workers." + name + ".command: empty"};
  for (const auto& pattern : cfg.routes)
    if (auto r = check_route(name, pattern); !r) return r;
  return {};
}

// Every kind's routes in one router, each route's id its kind's index: the same matcher, and the
// same conflicts, as the site the proxy routes are built into.
core::Result<http::Router> kinds_router(const std::vector<KindConfig>& kinds) {
  std::vector<http::RouteDef> defs;
  for (size_t i = 0; i < kinds.size(); ++i)
    for (const auto& pattern : kinds[i].routes) defs.push_back({pattern, i});
  auto router = http::Router::build(std::move(defs));
  if (!router) return core::Error{EINVAL, "workers: routes: " + router.error().reason};
  return std::move(router.value());
}

// What create() makes of a kind's zeros: no bound of its own, and three start timeouts to be
// ready.
void fill_defaults(KindConfig& cfg) {
  if (cfg.max_workers == 0) cfg.max_workers = SIZE_MAX;
  if (cfg.ready_timeout_ms == 0)
    cfg.ready_timeout_ms =
        static_cast<uint32_t>(std::min<uint64_t>(3 * uint64_t{cfg.start_timeout_ms}, UINT32_MAX));
}

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ",") + k;
  return out;
}

}  // namespace

std::optional<std::string> address_of(std::string_view kind,
                                      const std::vector<http::Param>& params) {
  std::string address(kind);
  for (const auto& p : params) {
    if (params.size() > 1 && p.value.find(':') != std::string::npos) return std::nullopt;
    address.append(":").append(p.value);
  }
  return address;
}

std::string encode_address(std::string_view address) {
  return http::percent_encode_name(address);
}

std::string lock_file_name(std::string_view address) {
  return core::bounded_file_name(address, kMaxLockName) + ".lock";
}

core::Result<std::unique_ptr<Manager>> Manager::create(core::EventLoop& loop, core::Logger& log,
                                                       ManagerOptions options,
                                                       std::unique_ptr<Launcher> launcher) {
  if (options.state_dir.empty())
    return core::Error{EINVAL, "workers: the state directory is empty"};
  while (options.state_dir.size() > 1 && options.state_dir.back() == '/')
    options.state_dir.pop_back();
  std::vector<KindConfig> checked;
  for (const auto& cfg : options.kinds) {
    if (auto r = check_kind(cfg, checked); !r) return r.error();
    checked.push_back(cfg);
  }
  auto router = kinds_router(options.kinds);
  if (!router) return router.error();
  std::vector<std::unique_ptr<Kind>> kinds;
  for (auto& cfg : options.kinds) {
    auto kind = std::make_unique<Kind>();
    fill_defaults(cfg);
    kind->config = std::move(cfg);
    kind->index = kinds.size();
    kinds.push_back(std::move(kind));
  }
  // A worker's socket path must fit sun_path (108 bytes with its NUL): long addresses get a
  // bounded name, but even the shortest one needs this much room after the directory.
  size_t socket_dir = options.state_dir.size() + sizeof("/sockets/") - 1;
  if (socket_dir + core::kMinFileName >= sizeof(sockaddr_un::sun_path))
    return core::Error{ENAMETOOLONG,
                       fmt::format("workers: the state directory \"{}\" is {} bytes long: worker "
                                   "sockets in it would not fit a Unix socket path ({} bytes); "
                                   "use a state directory of at most {} bytes",
                                   core::log_escaped(options.state_dir), options.state_dir.size(),
                                   sizeof(sockaddr_un::sun_path) - 1,
                                   sizeof(sockaddr_un::sun_path) - 1 - core::kMinFileName -
                                       (sizeof("/sockets/") - 1))};
  for (const char* sub : {"", "/sockets", "/locks", "/logs"}) {
    if (auto r = make_dir(options.state_dir + sub, 0700); !r) return r.error();
  }
  // Containment (containment.h): the cgroup v2 way or rlimits, decided and logged once here.
  bool limited =
      std::any_of(kinds.begin(), kinds.end(), [](const auto& k) { return k->config.limits.any(); });
  if (!launcher) {
    launcher = std::make_unique<ProcessLauncher>(Containment::create(log, {}, limited));
  }
  options.kinds.clear();
  std::string basis = "configured";
  if (options.max_starting == 0) options.max_starting = default_max_starting();
  if (options.max_workers == 0) {
    auto bound = default_max_workers();
    options.max_workers = bound.value;
    basis = std::move(bound.basis);
  }
  log.info("workers_bounds", "max_starting={} max_workers={} basis=\"{}\"", options.max_starting,
           options.max_workers, basis);
  std::unique_ptr<Manager> m(new Manager(loop, log, std::move(options), std::move(launcher)));
  m->limits_at_start_ = limited;
  m->live_by_kind_.assign(kinds.size(), 0);
  m->kinds_ = std::move(kinds);
  m->router_ = std::make_unique<http::Router>(std::move(router.value()));
  Manager* mp = m.get();
  // Orphans (orphans.h): what a worker leaves at its exit comes here rather than to init, and no
  // process of a worker's is in this session.
  if (!m->launcher_->become_subreaper())
    log.warn("workers_subreaper",
             "error=\"{}\" effect=\"the orphans of exited workers go to "
             "init and survive them\"",
             strerror(errno));
  m->session_ = getsid(0);
  m->orphan_sweep_.bind(loop.timers(), [mp] { mp->sweep_orphans(); });
  m->spares_timer_.bind(loop.timers(), [mp] { mp->spares_fill(); });
  for (auto& kind : m->kinds_)
    kind->spare_timer.bind(loop.timers(), [mp] { mp->spares_schedule(); });
  m->spares_schedule();  // the kinds' warm spares, once the loop runs
  return m;
}

Manager::Manager(core::EventLoop& loop, core::Logger& log, ManagerOptions options,
                 std::unique_ptr<Launcher> launcher)
    : loop_(loop),
      log_(log),
      options_(std::move(options)),
      launcher_(std::move(launcher)),
      idle_check_(loop.timers(), [this] {
        check_idle();
        arm_idle_check();
      }) {}

std::optional<std::string> Manager::address_for(std::string_view path) const {
  auto q = path.find_first_of("?#");
  if (q != std::string_view::npos) path = path.substr(0, q);
  // The route's kind and params, as the site's router gives them to the proxy route.
  http::Request req;
  auto match = router_->match(http::Method::kGet, "GET", path, req);
  if (match.kind != http::Router::MatchKind::kFound) return std::nullopt;
  return address_of(kinds_[match.id]->config.name, req.params);
}

std::vector<Manager::Ignored> Manager::reconfigure(std::vector<KindConfig> fresh,
                                                   size_t max_workers, size_t max_starting) {
  std::vector<Ignored> ignored;
  auto ignore = [&](const std::string& kind, std::string key, std::string reason) {
    log_.warn("reload_ignored", "kind={} key={} reason=\"{}\"", kind, key, reason);
    ignored.push_back({kind, std::move(key), std::move(reason)});
  };
  auto find_fresh = [&fresh](const std::string& name) -> KindConfig* {
    for (auto& cfg : fresh)
      if (cfg.name == name) return &cfg;
    return nullptr;
  };
  for (const auto& kind : kinds_)
    if (!find_fresh(kind->config.name))
      ignore(kind->config.name, "kind",
             "a kind goes only on restart (its workers keep running until they are idle)");
  for (const auto& cfg : fresh)
    if (std::none_of(kinds_.begin(), kinds_.end(),
                     [&cfg](const auto& k) { return k->config.name == cfg.name; }))
      ignore(cfg.name, "kind", "a kind is added only on restart (until then its requests get 404)");

  // The routes first, all kinds in one router, as create() builds it: a conflict keeps the old.
  std::vector<KindConfig> routed;
  bool routes_changed = false;
  for (const auto& kind : kinds_) {
    routed.push_back(kind->config);
    const KindConfig* next = find_fresh(kind->config.name);
    if (!next || next->routes == kind->config.routes) continue;
    bool valid = true;
    for (const auto& pattern : next->routes)
      if (auto r = check_route(next->name, pattern); !r) {
        ignore(next->name, "routes", r.error().reason);
        valid = false;
        break;
      }
    if (valid) {
      routed.back().routes = next->routes;
      routes_changed = true;
    }
  }
  std::optional<http::Router> router;
  if (routes_changed) {
    auto built = kinds_router(routed);
    if (built) {
      router = std::move(built.value());
    } else {
      for (const auto& kind : kinds_)
        if (routed[kind->index].routes != kind->config.routes)
          ignore(kind->config.name, "routes", built.error().reason);
    }
  }

  for (auto& kind_ptr : kinds_) {
    Kind& kind = *kind_ptr;
    KindConfig* found = find_fresh(kind.config.name);
    if (!found) continue;
    KindConfig next = std::move(*found);
    fill_defaults(next);
    KindConfig& cur = kind.config;
    const std::string& name = cur.name;
    std::vector<std::string> applied;
    auto take = [&applied](const char* key, auto& field, const auto& value) {
      if (field == value) return;
      field = value;
      applied.push_back(key);
    };
    // The next idle checks, starts, stops and rollouts read these.
    take("idle", cur.idle_ms, next.idle_ms);
    take("start_timeout", cur.start_timeout_ms, next.start_timeout_ms);
    take("ready_timeout", cur.ready_timeout_ms, next.ready_timeout_ms);
    take("stop_grace", cur.stop_grace_ms, next.stop_grace_ms);
    take("max_workers", cur.max_workers, next.max_workers);
    take("reload", cur.reload, next.reload);
    take("reload_timeout", cur.reload_timeout_ms, next.reload_timeout_ms);
    // The server processes' own: the new generation has them already; kept here for the state.
    take("response_timeout", cur.response_timeout_ms, next.response_timeout_ms);
    take("max_body", cur.max_body, next.max_body);
    if (router && routed[kind.index].routes != cur.routes) {
      cur.routes = routed[kind.index].routes;
      applied.push_back("routes");
    }
    if (next.heartbeat_ms != cur.heartbeat_ms) {
      // A live worker's next ping is timed by the kind's value: between two periods that is the
      // new one, but pings cannot be switched on or off under a worker that is already ready.
      if (cur.heartbeat_ms == 0 || next.heartbeat_ms == 0)
        ignore(name, "heartbeat", "pings are switched on or off only on restart");
      else
        take("heartbeat", cur.heartbeat_ms, next.heartbeat_ms);
    }
    // Limits apply to each worker at its launch; the containment itself (cgroup or rlimits) was
    // set up at start only if some kind had a limit then.
    bool containable = limits_at_start_ || !next.limits.any();
    for (auto [key, field, value] :
         {std::tuple<const char*, uint64_t*, uint64_t>{"memory_max", &cur.limits.memory_max,
                                                       next.limits.memory_max},
          {"pids_max", &cur.limits.pids_max, next.limits.pids_max}}) {
      if (*field == value) continue;
      if (containable)
        take(key, *field, value);
      else
        ignore(name, key, "no kind had a limit when corral started, so none is set up");
    }
    if (cur.limits.cpu_weight != next.limits.cpu_weight) {
      if (containable)
        take("cpu_weight", cur.limits.cpu_weight, next.limits.cpu_weight);
      else
        ignore(name, "cpu_weight", "no kind had a limit when corral started, so none is set up");
    }
    if (next.log_rotation.max_size != cur.log_rotation.max_size)
      ignore(name, "log_max_size", "the kind's log keeps the rotation it was opened with");
    if (next.log_rotation.keep != cur.log_rotation.keep)
      ignore(name, "log_keep", "the kind's log keeps the rotation it was opened with");
    if (next.command != cur.command)
      ignore(name, "command", "a kind's program changes only on restart; its workers run the old");
    if (next.env != cur.env) ignore(name, "env", "a kind's environment changes only on restart");
    if (next.code_dir != cur.code_dir)
      ignore(name, "code",
             "the code directory is read at start; new code goes out with corral ctl rollout");
    if (next.spares != cur.spares) {
      take("spares", cur.spares, next.spares);
      // Fewer: the newest spares no start has claimed go now; more: the next fill launches them.
      size_t live = 0;
      for (const auto& s : kind.spares) live += s->worker && !s->worker->stopping;
      for (auto it = kind.spares.rbegin(); it != kind.spares.rend() && live > cur.spares; ++it) {
        Worker* w = (*it)->worker.get();
        if (!w || w->stopping || w->claimed_by) continue;
        spare_stop(*w, "reload");
        --live;
      }
    }
    if (!applied.empty()) log_.info("reload_applied", "kind={} keys=\"{}\"", name, joined(applied));
  }
  if (router) router_ = std::make_unique<http::Router>(std::move(*router));

  // The bounds of all kinds: a lower one stops nothing, it holds the next starts back.
  std::string basis = "configured";
  if (max_starting == 0) max_starting = default_max_starting();
  if (max_workers == 0) {
    auto bound = default_max_workers();
    max_workers = bound.value;
    basis = std::move(bound.basis);
  }
  if (max_starting != options_.max_starting || max_workers != options_.max_workers) {
    options_.max_starting = max_starting;
    options_.max_workers = max_workers;
    log_.info("workers_bounds", "max_starting={} max_workers={} basis=\"{}\" reload=true",
              max_starting, max_workers, basis);
  }
  pump();  // higher bounds or more spares: the queue and the spares move now
  arm_idle_check();
  return ignored;
}

}  // namespace corral::workers
