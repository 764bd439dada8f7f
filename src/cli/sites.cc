#include "cli/sites.h"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "ws/socket.h"

namespace corral::cli {

namespace {

constexpr std::string_view kWelcome = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>corral</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<style nonce="{nonce}">body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}code{{background:#eee;padding:0 .2em}}footer{{color:#666;font-size:.9em}}</style>
</head><body>
<h1>corral is running</h1>
<p>This is the embedded default site. Serve a directory with <code>corral serve DIR</code>,
or write your own routes with the C++ API (see <code>examples/</code>).</p>
<ul>
<li><a href="/hello">/hello</a>: a 5-byte text response</li>
<li><a href="/json">/json</a>: a JSON description</li>
<li><a href="/users/42">/users/{{id}}</a>: a route parameter</li>
<li><a href="/stream">/stream</a>: a chunked stream, one line every 100 ms</li>
<li><code>POST /echo</code>: echoes the request body</li>
<li><code>ws://…/ws/echo</code>: a WebSocket that echoes every message</li>
{demo}</ul>
<p id="js">JavaScript with this response's CSP nonce did not run.</p>
<script nonce="{nonce}">document.getElementById('js').textContent='An inline script ran under this response\'s CSP nonce.';</script>
<footer><p>corral {version}. The documentation is in corral's source tree: <code>README.md</code>
(a tour), <code>docs/config.md</code> (the configuration), <code>docs/operate.md</code> (running it:
<code>corral ctl</code>, the admin listener, logs) and the rest of <code>docs/</code>.</p></footer>
</body></html>
)";

// The site's icon (a fence), at /favicon.ico where browsers ask for one, as SVG.
constexpr std::string_view kFavicon =
    R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">)"
    R"(<rect width="32" height="32" rx="6" fill="#2a5d8f"/>)"
    R"(<path d="M6 11h20M6 21h20M9 6v20M16 6v20M23 6v20" stroke="#fff" stroke-width="2.5")"
    R"( stroke-linecap="round"/></svg>)";

// Writes "tick N" every 100 ms, ten times; stops when the client goes away.
class TickStream final : public http::StreamProducer {
 public:
  explicit TickStream(core::EventLoop& loop) : timer_(loop.timers(), [this] { tick(); }) {}
  void on_start(http::StreamWriter& w) override {
    writer_ = &w;
    tick();
  }
  void on_abort() override {
    writer_ = nullptr;
    timer_.cancel();
  }

 private:
  void tick() {
    if (!writer_) return;
    writer_->write(fmt::format("tick {}\n", n_));
    if (++n_ == 10) {
      auto* w = writer_;
      writer_ = nullptr;
      w->end();
      return;
    }
    timer_.arm_after(100);
  }
  core::Timer timer_;
  http::StreamWriter* writer_ = nullptr;
  int n_ = 0;
};

std::string process_label = "slot=0";  // this process's value, set after the fork

}  // namespace

void set_process_slot(int slot) {
  process_label = fmt::format("slot={} pid={}", slot, ::getpid());
}

void add_process_header(http::SiteBuilder& site) {
  http::Wrap w;
  w.after = [](http::Request&, http::Response& r) { r.header("Corral-Process", process_label); };
  site.wrap("/*", std::move(w));
}

void add_welcome_routes(http::SiteBuilder& site, std::string demo_item, std::string version) {
  site.route("GET /",
             [demo_item = std::move(demo_item), version = std::move(version)](http::Request& req) {
               return http::Response::html(fmt::format(kWelcome, fmt::arg("nonce", req.csp_nonce()),
                                                       fmt::arg("demo", demo_item),
                                                       fmt::arg("version", version)));
             });
  site.route("GET /favicon.ico", [](http::Request&) {
    auto r = http::Response::bytes(std::string(kFavicon), "image/svg+xml");
    r.header("Cache-Control", "max-age=86400");
    return r;
  });
  site.route("GET /hello", [](http::Request&) { return http::Response::text("hello"); });
  site.route("GET /json", [](http::Request& req) {
    return http::Response::json({{"server", "corral"},
                                 {"remote", req.remote_address},
                                 {"scheme", req.scheme},
                                 {"principal", req.principal ? req.principal->id : ""}});
  });
  site.route("GET /users/{id}", [](http::Request& req) {
    return http::Response::json({{"id", req.param("id")}});
  });
  site.route("POST /echo", [](http::Request& req) {
    return http::Response::bytes(std::string(req.body),
                                 req.header("content-type").value_or("application/octet-stream"));
  });
  site.route("GET /stream", [](http::Request& req) {
    return http::Response::stream(std::make_unique<TickStream>(*req.loop),
                                  "text/plain; charset=utf-8");
  });
}

void add_welcome_sockets(http::SiteBuilder& site) {
  ws::SocketRoute echo;
  echo.on_open = [](ws::Socket& s) {
    s.on_message = [](ws::Socket& s, std::string_view data, bool binary) {
      binary ? s.send_binary(data) : s.send_text(data);
    };
  };
  ws::add_socket_route(site, "/ws/echo", std::move(echo));
}

void add_static_routes(http::SiteBuilder& site, const std::string& root, bool serve_dotfiles) {
  site.route("GET /*", [root, serve_dotfiles](http::Request& req) {
    http::FileSpec spec;
    spec.root = root;
    spec.path = req.wildcard;
    spec.dotfiles = serve_dotfiles;
    return http::Response::file(std::move(spec));
  });
}

}  // namespace corral::cli
