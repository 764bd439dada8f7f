// The HTTP/3 test site: one process, http::run_server with a TCP listener and, as its companion,
// an Http3Server on a UDP socket bound to the same port (SO_REUSEPORT, slot 0 of 1, steering mode
// kForward with no forwarding sockets). Routes:
//   GET /whoami       "pid=<pid> slot=<slot>"
//   GET /bytes/{n}    n bytes ('a'..'z' repeating), streamed with backpressure, Content-Length n
//   GET /stream       a stream of 5 chunks, 30 ms apart, unknown length
//   GET /json         a JSON object
//   GET /html         an HTML page with a CSP nonce
//   GET /deferred     a deferred response (answers after 20 ms)
//   POST /upload      the body's length
//   GET /static/*     files under --root (ranges, conditionals)
//   GET /h3stats      the Http3Server's counters (JSON)
//   GET /ws           a WebSocket-style upgrade (HTTP/3 answers 501)
// Flags: --cert/--key PEM files, --port (0: any), --root DIR, --retry on|off|auto,
//        --secret-hex (64 hex digits; the stateless-reset/token secret), --tag (CID tag),
//        --idle-ms, --close-timeout-ms, --max-body (bytes), --retry-rate (kAuto's Initials/s),
//        --retries-per-sec, --resets-per-sec, --max-unvalidated, --unvalidated-timeout-ms,
//        --max-connections (the Http3Options of the same names),
//        --slots N (N > 1: a parent makes N UDP sockets in one SO_REUSEPORT group and N forwarding
//        socketpairs, forks N server processes, one per slot, and stops them on SIGTERM),
//        --steering forward|off, --publish-delay-ms N (the site is published N ms after
//        listening), --ready-timeout-ms. Prints "PORT <n>" on stdout once listening; SIGTERM
//        closes gracefully.
#include <gnutls/crypto.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/socket.h"
#include "http/runner.h"
#include "http/site.h"
#include "quic/server.h"
#include "tls/credentials.h"

namespace {

using namespace corral;

class BytesStream final : public http::StreamProducer {
 public:
  explicit BytesStream(uint64_t n) : left_(n) {
    chunk_.resize(64 * 1024);
    for (size_t i = 0; i < chunk_.size(); ++i) chunk_[i] = static_cast<char>('a' + i % 26);
  }
  void on_start(http::StreamWriter& w) override { on_writable(w); }
  void on_writable(http::StreamWriter& w) override {
    while (left_ > 0) {
      // Chunks are whole multiples of 26 so the pattern continues across them.
      size_t n = left_ < chunk_.size() ? static_cast<size_t>(left_) : chunk_.size() / 26 * 26;
      left_ -= n;
      bool more = w.write(std::string_view(chunk_.data(), n));
      if (left_ == 0) {
        w.end();
        return;
      }
      if (!more) return;
    }
  }

 private:
  uint64_t left_;
  std::string chunk_;
};

class ChunkStream final : public http::StreamProducer {
 public:
  explicit ChunkStream(core::EventLoop& loop) : timer_(loop.timers(), [this] { fire(); }) {}
  void on_start(http::StreamWriter& w) override {
    writer_ = &w;
    fire();
  }
  void on_abort() override { writer_ = nullptr; }

 private:
  void fire() {
    if (!writer_) return;
    writer_->write("chunk " + std::to_string(sent_) + "\n");
    if (++sent_ == 5) {
      auto* w = writer_;
      writer_ = nullptr;
      w->end();
      return;
    }
    timer_.arm_after(30);
  }
  core::Timer timer_;
  int sent_ = 0;
  http::StreamWriter* writer_ = nullptr;
};

class LaterResponse final : public http::DeferredProducer {
 public:
  explicit LaterResponse(core::EventLoop& loop) : timer_(loop.timers(), [this] { fire(); }) {}
  void start(http::Responder& r) override {
    responder_ = &r;
    timer_.arm_after(20);
  }
  void on_abort() override { responder_ = nullptr; }

 private:
  void fire() {
    if (!responder_) return;
    auto* r = responder_;
    responder_ = nullptr;
    r->respond(http::Response::text("deferred ok\n"));
  }
  core::Timer timer_;
  http::Responder* responder_ = nullptr;
};

bool parse_hex(const std::string& hex, uint8_t* out, size_t len) {
  if (hex.size() != 2 * len) return false;
  for (size_t i = 0; i < len; ++i) {
    unsigned v = 0;
    auto r = std::from_chars(hex.data() + 2 * i, hex.data() + 2 * i + 2, v, 16);
    if (r.ec != std::errc() || r.ptr != hex.data() + 2 * i + 2) return false;
    out[i] = static_cast<uint8_t>(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"corral HTTP/3 test site"};
  std::string cert, key, root, retry = "auto", secret_hex;
  int port = 0;
  uint32_t tag = 0, idle_ms = 30'000, close_timeout_ms = 10'000;
  app.add_option("--cert", cert)->required();
  app.add_option("--key", key)->required();
  app.add_option("--port", port);
  app.add_option("--root", root);
  app.add_option("--retry", retry)->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--secret-hex", secret_hex);
  app.add_option("--tag", tag);
  app.add_option("--idle-ms", idle_ms);
  app.add_option("--close-timeout-ms", close_timeout_ms);
  uint64_t max_body = 8 << 20;
  uint32_t retry_rate = 1000;
  app.add_option("--max-body", max_body);
  app.add_option("--retry-rate", retry_rate);
  uint32_t retries_per_sec = 10'000, resets_per_sec = 200, unvalidated_timeout_ms = 5'000;
  size_t max_unvalidated = 256, max_connections = 10'000;
  app.add_option("--retries-per-sec", retries_per_sec);
  app.add_option("--resets-per-sec", resets_per_sec);
  app.add_option("--max-unvalidated", max_unvalidated);
  app.add_option("--unvalidated-timeout-ms", unvalidated_timeout_ms);
  app.add_option("--max-connections", max_connections);
  uint32_t publish_delay_ms = 0, ready_timeout_ms = 10'000;
  app.add_option("--publish-delay-ms", publish_delay_ms);
  app.add_option("--ready-timeout-ms", ready_timeout_ms);
  int slots = 1;
  std::string steering_mode = "forward";
  app.add_option("--slots", slots)->check(CLI::Range(1, 16));
  app.add_option("--steering", steering_mode)->check(CLI::IsMember({"forward", "off"}));
  CLI11_PARSE(app, argc, argv);

  core::Logger log(2, core::LogLevel::kInfo);
  auto creds = tls::Credentials::load(cert, key);
  if (!creds) {
    log.error("cert", "error=\"{}\"", creds.error().reason);
    return 78;
  }
  auto ticket = tls::TicketKey::generate();
  if (!ticket) {
    log.error("ticket_key", "error=\"{}\"", ticket.error().reason);
    return 78;
  }
  auto secrets = std::make_shared<quic::Secrets>();
  if (secret_hex.empty()) {
    (void)gnutls_rnd(GNUTLS_RND_KEY, secrets->static_secret, sizeof secrets->static_secret);
  } else if (!parse_hex(secret_hex, secrets->static_secret, sizeof secrets->static_secret)) {
    log.error("secret", "error=\"--secret-hex needs 64 hex digits\"");
    return 64;
  }
  quic::SteeringKey steering;
  if (tag == 0) (void)gnutls_rnd(GNUTLS_RND_NONCE, &tag, sizeof tag);
  steering.tag = tag;
  (void)gnutls_rnd(GNUTLS_RND_NONCE, &steering.seed, sizeof steering.seed);
  steering.slots = static_cast<uint32_t>(slots);

  // TCP first (port 0 picks one), then UDP on the same port number.
  auto addr = core::parse_address("127.0.0.1:" + std::to_string(port));
  if (!addr) return 64;
  auto tcp = core::listen_tcp(addr.value(), core::ListenOptions{4096, true});
  if (!tcp) {
    log.error("listen_failed", "error=\"{}\"", tcp.error().reason);
    return 1;
  }
  auto bound = core::local_address(tcp->get());
  if (!bound) return 1;
  // One UDP socket per slot, all in one SO_REUSEPORT group, bound in slot order.
  std::vector<int> udps;
  for (int i = 0; i < slots; ++i) {
    int udp = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(udp, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(udp, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (bind(udp, reinterpret_cast<const sockaddr*>(&bound->storage), bound->len) != 0) {
      log.error("listen_failed", "udp=1 error=\"{}\"", strerror(errno));
      return 1;
    }
    udps.push_back(udp);
  }
  // Forwarding: slot i reads pairs[i][0]; everyone writes to pairs[i][1].
  std::vector<std::array<int, 2>> pairs(static_cast<size_t>(slots), {-1, -1});
  if (slots > 1) {
    for (auto& p : pairs) {
      if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, p.data()) != 0) return 1;
      int buf = 1 << 20;
      setsockopt(p[0], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
      setsockopt(p[1], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    }
  }
  int slot = 0;
  if (slots > 1) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    std::vector<pid_t> kids;
    bool child = false;
    for (int i = 0; i < slots; ++i) {
      pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed harness takes its slots with it
        slot = i;
        child = true;
        break;
      }
      kids.push_back(pid);
    }
    if (!child) {
      std::printf("PORT %d\n", bound->port());
      std::fflush(stdout);
      int sig = 0;
      sigwait(&set, &sig);
      for (pid_t k : kids) kill(k, SIGTERM);
      int rc = 0;
      for (pid_t k : kids) {
        int status = 0;
        waitpid(k, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
      }
      return rc;
    }
  }

  quic::ProcessContext ctx;
  ctx.slot = slot;
  ctx.key = steering;
  ctx.mode = steering_mode == "off" ? quic::SteeringMode::kOff : quic::SteeringMode::kForward;
  ctx.udp_fds = {udps[static_cast<size_t>(slot)]};
  ctx.forward_rx = pairs[static_cast<size_t>(slot)][0];
  // One generation (1, parity 1) and no reloads here: no pair for parity 0.
  for (auto& p : pairs) ctx.forward_tx.push_back({-1, p[1]});
  ctx.secrets = secrets;
  ctx.credentials = creds.value();
  ctx.ticket_key = ticket.value();
  quic::Http3Options h3opts;
  h3opts.idle_timeout_ms = idle_ms;
  h3opts.retry_auto_initials_per_sec = retry_rate;
  h3opts.retries_per_sec = retries_per_sec;
  h3opts.stateless_resets_per_sec = resets_per_sec;
  h3opts.max_unvalidated_handshakes = max_unvalidated;
  h3opts.unvalidated_handshake_timeout_ms = unvalidated_timeout_ms;
  h3opts.max_connections = max_connections;
  h3opts.retry = retry == "on"    ? quic::RetryMode::kOn
                 : retry == "off" ? quic::RetryMode::kOff
                                  : quic::RetryMode::kAuto;

  quic::Http3Server* h3_ptr = nullptr;
  http::SiteBuilder site;
  site.route("GET /whoami", [slot](http::Request&) {
    return http::Response::text("pid=" + std::to_string(getpid()) +
                                " slot=" + std::to_string(slot) + "\n");
  });
  site.route("GET /bytes/{n}", [](http::Request& req) {
    uint64_t n = 0;
    auto v = req.param("n");
    std::from_chars(v.data(), v.data() + v.size(), n);
    return http::Response::stream(std::make_unique<BytesStream>(n), "application/octet-stream", n);
  });
  site.route("GET /stream", [](http::Request& req) {
    return http::Response::stream(std::make_unique<ChunkStream>(*req.loop), "text/plain");
  });
  site.route("GET /json", [](http::Request& req) {
    return http::Response::json({{"ok", true}, {"host", std::string(req.host)}});
  });
  site.route("GET /html", [](http::Request& req) {
    std::string nonce(req.csp_nonce());
    return http::Response::html("<!doctype html><script nonce=\"" + nonce + "\">1</script>\n");
  });
  site.route("GET /deferred", [](http::Request& req) {
    return http::Response::deferred(std::make_unique<LaterResponse>(*req.loop));
  });
  site.route("POST /upload", [](http::Request& req) {
    return http::Response::text(std::to_string(req.body.size()) + "\n");
  });
  site.route("GET /ws", [](http::Request&) {
    struct Never final : http::UpgradeHandler {
      void take_over(http::UpgradeContext) override {}
    };
    return http::Response::upgrade(std::make_unique<Never>());
  });
  site.route("GET /static/*", [root](http::Request& req) {
    http::FileSpec spec;
    spec.root = root;
    spec.path = req.wildcard;
    return http::Response::file(std::move(spec));
  });
  site.route("GET /h3stats", [&h3_ptr](http::Request&) {
    nlohmann::json j;
    if (h3_ptr) j = h3_ptr->stats_json();
    return http::Response::json(j);
  });
  auto built = site.build();
  if (!built) {
    log.error("site", "error=\"{}\"", built.error().reason);
    return 1;
  }

  http::RunOptions opts;
  opts.adopt_fds = {tcp->release()};
  opts.server.close_timeout_ms = close_timeout_ms;
  opts.server.limits.max_body = max_body;
  opts.server.ready_timeout_ms = ready_timeout_ms;
  opts.on_server = [&](http::Server& server) {
    auto h3 = std::make_shared<quic::Http3Server>(server, ctx, h3opts);
    if (auto r = h3->start(); !r) {
      log.error("quic_start", "error=\"{}\"", r.error().reason);
      std::exit(1);
    }
    h3_ptr = h3.get();
    http::RunOptions::Companion c;
    if (publish_delay_ms) {
      // The site comes later (run_server publishes none): requests wait for it.
      struct Later {
        core::Timer timer;
        std::shared_ptr<quic::Http3Server> h3;
      };
      auto later = std::make_shared<Later>();
      later->h3 = h3;
      later->timer.bind(server.loop().timers(),
                        [&server, site = built.value()] { server.publish(site); });
      later->timer.arm_after(publish_delay_ms);
      c.keep = later;
    } else {
      c.keep = h3;
    }
    c.close = [h3](std::function<void()> done) { h3->close(std::move(done)); };
    return c;
  };
  opts.on_listening = [&](http::Server&, const std::vector<core::SocketAddress>& addrs) {
    if (slots > 1) return;  // the parent printed it
    std::printf("PORT %d\n", addrs.empty() ? 0 : addrs.front().port());
    std::fflush(stdout);
  };
  int rc = http::run_server(log, opts, publish_delay_ms ? nullptr : built.value());
  h3_ptr = nullptr;
  return rc;
}
