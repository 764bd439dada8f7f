#include "http/runner.h"

#include <signal.h>
#include <unistd.h>

namespace corral::http {

namespace {

// Binds options' listeners (plain, then TLS; addresses, then adopted fds) and appends what each
// is bound to to `bound`. False, after logging why, when one fails.
bool bind_listeners(core::Logger& log, const RunOptions& options, Server& server,
                    std::vector<core::SocketAddress>& bound) {
  for (const auto& addr : options.listen) {
    auto r = server.listen(addr);
    if (!r) {
      log.error("listen_failed", "address={} error=\"{}\"", addr.to_string(), r.error().reason);
      return false;
    }
    bound.push_back(r.value());
    log.info("listening", "address={}", r->to_string());
  }
  for (int fd : options.adopt_fds) {
    auto local = core::local_address(fd);
    if (auto r = server.adopt_listener(core::UniqueFd(fd)); !r || !local) {
      log.error("listen_failed", "fd={} error=\"{}\"", fd,
                r ? local.error().reason : r.error().reason);
      return false;
    }
    bound.push_back(local.value());
  }
  if ((!options.listen_tls.empty() || !options.adopt_tls_fds.empty()) && !options.tls) {
    log.error("listen_failed", "error=\"TLS listeners without a TLS configuration\"");
    return false;
  }
  for (const auto& addr : options.listen_tls) {
    auto r = server.listen(addr, false, options.tls);
    if (!r) {
      log.error("listen_failed", "address={} error=\"{}\"", addr.to_string(), r.error().reason);
      return false;
    }
    bound.push_back(r.value());
    log.info("tls_listening", "address={}", r->to_string());
  }
  for (int fd : options.adopt_tls_fds) {
    auto local = core::local_address(fd);
    if (auto r = server.adopt_listener(core::UniqueFd(fd), options.tls); !r || !local) {
      log.error("listen_failed", "fd={} error=\"{}\"", fd,
                r ? local.error().reason : r.error().reason);
      return false;
    }
    bound.push_back(local.value());
  }
  return true;
}

// The signal handlers' shared state, alive in run_server's frame while the loop runs. The first
// signal closes (or drains) gracefully; SIGTERM during a drain closes the upgraded connections
// too; one more stops the loop.
struct Shutdown {
  core::EventLoop& loop;
  core::Logger& log;
  Server& server;
  RunOptions::Companion& companion;
  std::function<void()> on_close;
  bool escalated = false;

  void begin_close(const signalfd_siginfo& si, bool drain) {
    if (server.closing()) {
      if (drain) return;
      if (server.draining() && !escalated) {
        escalated = true;
        log.info("shutdown", "signal={} connections={} draining=1", si.ssi_signo,
                 server.stats().active);
        server.close(nullptr);
        return;
      }
      log.info("shutdown_forced", "signal={}", si.ssi_signo);
      loop.stop();
      return;
    }
    log.info(drain ? "drain" : "shutdown", "signal={} connections={}", si.ssi_signo,
             server.stats().active);
    if (!drain && on_close) on_close();
    int pending = companion.close ? 2 : 1;
    core::EventLoop* stop_loop = &loop;
    auto one_done = [stop_loop, pending]() mutable {
      if (--pending == 0) stop_loop->stop();
    };
    auto shared_done = std::make_shared<std::function<void()>>(one_done);
    if (drain)
      server.drain([shared_done] { (*shared_done)(); });
    else
      server.close([shared_done] { (*shared_done)(); });
    // HTTP/3 has no upgraded connections: it drains as it closes (GOAWAY, running streams finish).
    if (companion.close) companion.close([shared_done] { (*shared_done)(); });
  }

  // SIGTERM and SIGINT close, options.drain_signal drains, SIGHUP reloads the admission policy.
  void install(const RunOptions& options) {
    auto shutdown = [this](const signalfd_siginfo& si) { begin_close(si, false); };
    (void)loop.on_signal(SIGTERM, shutdown);
    (void)loop.on_signal(SIGINT, shutdown);
    if (options.drain_signal != 0)
      (void)loop.on_signal(options.drain_signal,
                           [this](const signalfd_siginfo& si) { begin_close(si, true); });
    // SIGUSR1 (logrotate's postrotate, or the supervisor passing it on): the buffered access
    // lines go to the old file, then the log files are opened again by path.
    (void)loop.on_signal(SIGUSR1, [this](const signalfd_siginfo&) {
      if (auto failed = log.reopen(); !failed.empty())
        log.error("logs_reopen_failed", "error=\"{}\"", failed);
      else
        log.info("logs_reopened", "pid={}", getpid());
    });
    const RunOptions* opts = &options;
    (void)loop.on_signal(SIGHUP, [this, opts](const signalfd_siginfo&) {
      if (!opts->on_reload) return;
      if (auto p = opts->on_reload()) {
        server.set_policy(std::move(p));
        log.info("reloaded", "what=admission_policy");
      }
    });
  }
};

}  // namespace

int run_server(core::Logger& log, const RunOptions& options, std::shared_ptr<const Site> site) {
  signal(SIGPIPE, SIG_IGN);
  core::EventLoop loop;
  std::shared_ptr<void> services;
  if (options.on_loop) services = options.on_loop(loop);
  Server server(loop, log, options.server);
  if (options.policy) server.set_policy(options.policy);
  std::vector<core::SocketAddress> bound;
  if (!bind_listeners(log, options, server, bound)) return 1;
  RunOptions::Companion companion;
  if (options.on_server) companion = options.on_server(server);
  if (options.on_listening) options.on_listening(server, bound);
  server.publish(std::move(site));

  Shutdown shutdown{loop, log, server, companion, options.on_close};
  shutdown.install(options);
  core::Timer log_flush(loop.timers(), nullptr);
  log_flush.bind(loop.timers(), [&] {
    log.flush();
    log_flush.arm_after(200);
  });
  log_flush.arm_after(200);
  loop.run();
  log.info("stopped", "requests={}", server.stats().requests);
  log.flush();
  companion = {};
  services.reset();
  return 0;
}

}  // namespace corral::http
