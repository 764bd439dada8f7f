// The e2e test site: corral's HTTP core, embedded the way an application would (EventLoop, Server,
// SiteBuilder), with the routes the end-to-end tests need on top of the welcome site:
//   /canary            any method; counts its runs (a smuggled request must never reach it)
//   GET /canary/count  how many times /canary ran
//   GET /slow?ms=N     a stream that answers after N ms
//   GET /big?bytes=N   N bytes of text
//   GET /infinite      a stream that never ends; GET /infinite/aborts counts producers stopped
//   GET /throw         a route that throws (the client must see a generic 500)
//   POST /upload       the body's length
//   GET /files/*       files under --root
//   GET /download/*    the same, as an attachment named "résumé \"x\".txt"
//   GET /whoami        the principal ("Authorization: Bearer t" -> tester) or "anonymous"
//   GET /wrapped/*     answered by a wrap's before; every /wrapped/ response gets X-Wrapped
//   GET /html          an HTML page that uses its CSP nonce
//   GET /scheme        the request's scheme ("http" or "https")
//   /ws/echo           WebSocket echo (text and binary); subprotocols "echo.v2", "echo.v1";
//                      allowed extra origin http://allowed.example
//   /ws/chat/{room}    WebSocket broadcast to every socket of the room
//   /ws/limited        max_message 1024, max_buffered 64 KiB, ping every 300 ms, idle 1 s,
//                      close timeout 500 ms; "flood" makes it send 1 MiB messages until dropped
//   /ws/who            sends the principal's id (or "anonymous") and the {param}-less pattern
// Flags: --listen ADDR (port 0: any), --root DIR, --config FILE (corral's TOML),
//        --publish-delay-ms N (routes are published N ms after listening),
//        --tls-listen ADDR --tls-cert PEM --tls-key PEM (a TLS listener, too),
//        --alt-svc VALUE (ServerOptions::alt_svc).
// Logs go to stderr; the "listening address=..." line gives the bound port ("tls_listening
// address=..." the TLS one).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <iostream>

#include "cli/config.h"
#include "cli/sites.h"
#include "http/server.h"
#include "tls/session.h"
#include "tls/transport.h"
#include "ws/socket.h"

#include <map>
#include <set>

namespace {

using namespace corral;

size_t query_number(std::string_view query, std::string_view key, size_t fallback) {
  auto pos = query.find(std::string(key) + "=");
  if (pos == std::string_view::npos) return fallback;
  auto v = query.substr(pos + key.size() + 1);
  size_t n = fallback;
  std::from_chars(v.data(), v.data() + v.size(), n);
  return n;
}

class SlowStream final : public http::StreamProducer {
 public:
  SlowStream(core::EventLoop& loop, size_t ms)
      : timer_(loop.timers(), [this] { fire(); }), ms_(ms) {}
  void on_start(http::StreamWriter& w) override {
    writer_ = &w;
    timer_.arm_after(ms_);
  }
  void on_abort() override { writer_ = nullptr; }

 private:
  void fire() {
    if (!writer_) return;
    writer_->write("slow done\n");
    auto* w = writer_;
    writer_ = nullptr;
    w->end();
  }
  core::Timer timer_;
  size_t ms_;
  http::StreamWriter* writer_ = nullptr;
};

class InfiniteStream final : public http::StreamProducer {
 public:
  explicit InfiniteStream(size_t& aborts) : aborts_(aborts), chunk_(16 * 1024, 'x') {}
  void on_start(http::StreamWriter& w) override { on_writable(w); }
  void on_writable(http::StreamWriter& w) override {
    while (w.write(chunk_)) {
    }
  }
  void on_abort() override { ++aborts_; }

 private:
  size_t& aborts_;
  std::string chunk_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"corral e2e test site"};
  std::string listen = "127.0.0.1:0", root, config_path;
  uint32_t publish_delay_ms = 0;
  app.add_option("--listen", listen);
  app.add_option("--root", root);
  app.add_option("--config", config_path);
  app.add_option("--publish-delay-ms", publish_delay_ms);
  std::string tls_listen, tls_cert, tls_key;
  app.add_option("--tls-listen", tls_listen);
  app.add_option("--tls-cert", tls_cert);
  app.add_option("--tls-key", tls_key);
  std::string alt_svc;
  app.add_option("--alt-svc", alt_svc);
  CLI11_PARSE(app, argc, argv);

  cli::Config config;
  if (!config_path.empty()) {
    auto errors = cli::load_config(config_path, config);
    for (const auto& p : errors.problems) std::cerr << "config: " << p << "\n";
    if (!errors.empty()) return cli::kExitBadConfig;
  }
  if (!alt_svc.empty()) config.server.alt_svc = alt_svc;
  cli::ConfigErrors errors;
  auto policy = cli::build_policy(config, errors);
  auto addr = core::parse_address(listen);
  if (!addr || !errors.empty()) {
    std::cerr << "bad --listen or config\n";
    return cli::kExitBadConfig;
  }

  size_t canary_runs = 0;
  size_t infinite_aborts = 0;
  http::SiteBuilder site;
  cli::add_welcome_routes(site);
  site.route("/canary", [&](http::Request&) {
    ++canary_runs;
    return http::Response::text("canary\n");
  });
  site.route("GET /scheme",
             [](http::Request& req) { return http::Response::text(std::string(req.scheme)); });
  site.route("GET /canary/count",
             [&](http::Request&) { return http::Response::text(std::to_string(canary_runs)); });
  site.route("GET /slow", [](http::Request& req) {
    return http::Response::stream(
        std::make_unique<SlowStream>(*req.loop, query_number(req.query, "ms", 1000)), "text/plain");
  });
  site.route("GET /big", [](http::Request& req) {
    return http::Response::text(std::string(query_number(req.query, "bytes", 1 << 20), 'b'));
  });
  site.route("GET /infinite", [&](http::Request&) {
    return http::Response::stream(std::make_unique<InfiniteStream>(infinite_aborts), "text/plain");
  });
  site.route("GET /infinite/aborts",
             [&](http::Request&) { return http::Response::text(std::to_string(infinite_aborts)); });
  site.route("GET /throw", [](http::Request&) -> http::Response {
    throw std::runtime_error("secret internal detail");
  });
  site.route("POST /upload", [](http::Request& req) {
    return http::Response::text(std::to_string(req.body.size()));
  });
  site.route("GET /files/*", [root](http::Request& req) {
    return http::Response::file({.root = root, .path = req.wildcard});
  });
  site.route("GET /download/*", [root](http::Request& req) {
    return http::Response::file(
        {.root = root, .path = req.wildcard, .download_name = "résumé \"x\".txt"});
  });
  site.authenticate([](const http::Request& req) -> std::optional<http::Principal> {
    if (req.header("authorization") == "Bearer t") return http::Principal{"tester", {}};
    return std::nullopt;
  });
  site.route("GET /whoami", [](http::Request& req) {
    return http::Response::text(req.principal ? req.principal->id : "anonymous");
  });
  site.wrap("/wrapped/*",
            {.before = [](http::Request& req) -> std::optional<http::Response> {
               if (req.path == "/wrapped/short") return http::Response::text("from wrap");
               return std::nullopt;
             },
             .after = [](http::Request&, http::Response& r) { r.header("X-Wrapped", "1"); }});
  site.route("GET /wrapped/{x}", [](http::Request& req) {
    return http::Response::text("route " + std::string(req.param("x")));
  });
  site.route("GET /html", [](http::Request& req) {
    return http::Response::html("<script nonce=\"" + std::string(req.csp_nonce()) +
                                "\">1</script>");
  });

  ws::SocketRoute echo;
  echo.handshake.allowed_origins = {"http://allowed.example"};
  echo.handshake.subprotocols = {"echo.v2", "echo.v1"};
  echo.limits = [](const http::Request&) {
    ws::SocketLimits l;
    l.max_message = 64 * 1024 * 1024;
    l.max_buffered = 256 * 1024 * 1024;
    return l;
  };
  echo.on_open = [](ws::Socket& s) {
    s.on_message = [](ws::Socket& s, std::string_view data, bool binary) {
      if (binary) {
        s.send_binary(data);
      } else if (data == "close-me") {
        s.close(4000, "asked to");
      } else {
        s.send_text(data);
      }
    };
  };
  ws::add_socket_route(site, "/ws/echo", echo);

  std::map<std::string, std::set<ws::Socket*>> rooms;
  ws::SocketRoute chat;
  chat.on_open = [&rooms](ws::Socket& s) {
    std::string room(s.param("room"));
    rooms[room].insert(&s);
    s.on_message = [&rooms, room](ws::Socket& from, std::string_view data, bool) {
      for (ws::Socket* peer : rooms[room])
        if (peer != &from) peer->send_text(data);
    };
    s.on_close = [&rooms, room](ws::Socket& s, uint16_t, std::string_view) {
      rooms[room].erase(&s);
    };
  };
  ws::add_socket_route(site, "/ws/chat/{room}", chat);

  ws::SocketRoute limited;
  limited.limits = [](const http::Request& req) {
    ws::SocketLimits l;
    l.max_message = req.principal ? 4096 : 1024;  // limits may depend on the principal
    l.max_buffered = 64 * 1024;
    l.ping_interval_ms = 300;
    l.idle_timeout_ms = 1000;
    l.close_timeout_ms = 500;
    return l;
  };
  limited.on_open = [](ws::Socket& s) {
    s.on_message = [](ws::Socket& s, std::string_view data, bool) {
      if (data == "flood") {
        std::string big(1024 * 1024, 'f');
        while (s.send_binary(big)) {
        }
        return;
      }
      s.send_text(data);
    };
  };
  ws::add_socket_route(site, "/ws/limited", limited);

  ws::SocketRoute who;
  who.on_open = [](ws::Socket& s) { s.send_text(s.principal() ? s.principal()->id : "anonymous"); };
  ws::add_socket_route(site, "/ws/who", who);

  core::Logger log(2, config.log_level);
  site.on_error([&log](const http::ErrorEvent& e) {
    log.error("route_error", "pattern=\"{}\" error=\"{}\"", e.pattern, e.message);
  });
  auto built = site.build();
  if (!built) {
    std::cerr << built.error().reason << "\n";
    return cli::kExitBadConfig;
  }

  signal(SIGPIPE, SIG_IGN);
  core::EventLoop loop;
  http::Server server(loop, log, config.server);
  server.set_policy(policy);
  auto bound = server.listen(addr.value());
  if (!bound) {
    log.error("listen_failed", "error=\"{}\"", bound.error().reason);
    return 1;
  }
  log.info("listening", "address={}", bound->to_string());
  if (!tls_listen.empty()) {
    auto tls_addr = core::parse_address(tls_listen);
    auto creds = tls::Credentials::load(tls_cert, tls_key);
    auto ticket = tls::TicketKey::generate();
    if (!tls_addr || !creds || !ticket) {
      std::cerr << "bad --tls-listen, --tls-cert or --tls-key: "
                << (!creds ? creds.error().reason : "") << "\n";
      return cli::kExitBadConfig;
    }
    auto tls_config = tls::ServerConfig::create(creds.value(), ticket.value());
    if (!tls_config) {
      std::cerr << tls_config.error().reason << "\n";
      return 1;
    }
    auto tls_bound = server.listen(tls_addr.value(), false,
                                   std::make_shared<tls::TlsTransportFactory>(tls_config.value()));
    if (!tls_bound) {
      log.error("listen_failed", "error=\"{}\"", tls_bound.error().reason);
      return 1;
    }
    log.info("tls_listening", "address={}", tls_bound->to_string());
  }
  core::Timer publish(loop.timers(), [&] { server.publish(built.value()); });
  if (publish_delay_ms) {
    publish.arm_after(publish_delay_ms);
  } else {
    server.publish(built.value());
  }
  auto shutdown = [&](const signalfd_siginfo&) {
    if (server.closing()) return loop.stop();
    log.info("shutdown", "connections={}", server.stats().active);
    server.close([&] { loop.stop(); });
  };
  (void)loop.on_signal(SIGTERM, shutdown);
  (void)loop.on_signal(SIGINT, shutdown);
  (void)loop.on_signal(SIGHUP, [&](const signalfd_siginfo&) {
    cli::Config fresh;
    auto e = cli::load_config(config_path, fresh);
    if (!e.empty()) {
      for (const auto& p : e.problems) log.error("reload_refused", "problem=\"{}\"", p);
      return;
    }
    server.set_policy(cli::build_policy(fresh, e));
    log.info("reloaded", "what=admission_policy");
  });
  core::Timer flush(loop.timers(), nullptr);
  flush.bind(loop.timers(), [&] {
    log.flush();
    flush.arm_after(100);
  });
  flush.arm_after(100);
  loop.run();
  log.info("stopped", "requests={}", server.stats().requests);
  return 0;
}
