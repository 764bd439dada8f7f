// A worker in C++: one counter per address, started by corral's worker manager (see
// docs/worker-protocol.md; examples/worker_python/worker.py is the same worker in Python).
//
//   GET  /          the count
//   POST /inc       adds one, returns the new count
//   GET  /query     the request's query string (a request-specific answer)
//   GET  /trace     the request's traceparent (Request::traceparent(), the proxy's)
//   GET  /start     the start data the manager sent
//   GET  /busy?ms=N holds the worker busy (not idle) for N ms, as background work would
//   GET  /slow?ms=N answers after N ms (a request in flight: not idle meanwhile)
//   GET  /block?ms=N sleeps N ms in the handler: the loop is stuck meanwhile (no request, no
//                   `pong`: a hanging worker, which the manager stops as unresponsive)
//   GET  /echo      a WebSocket echoing each message (an open upgraded connection: not idle)
//   GET  /crash     aborts (a crash: the address becomes failed)
//   GET  /fatal     reports a fatal error whose text holds a secret; only the redacted form crosses
//   POST /count     reads the request body as it streams (http/body_stream.h) and answers
//                   {"bytes": its length}; nothing of it is kept
//   GET  /count/aborted  how many /count bodies this worker saw cut short (the client left)
//   GET  /code      {"version": the code version running (null without code), "hello": hello.txt
//                   of that version's directory (null if it has none), "pid": the process id}
//
// Reload in place (docs/worker-protocol.md, "Code and reload"): the reload hook re-reads hello.txt
// from the new set's directory and swaps version and text together, so that one /code answer
// never mixes two sets. A new set holding a file named `reload-fails` is refused (the error code
// `reload_failed`: the worker keeps its old code); one holding `reload-sleep-ms` (a number) makes
// the hook take that long (it holds the loop: a test of what a slow hook does). With the
// environment variable CORRAL_NO_RELOAD=1 no hook is registered (`ready` then says the worker
// cannot reload, and a rollout replaces it).
//
// The count lives in <state dir>/data/<address>.count, the address percent-encoded as in the lock
// path ("doc%3A42.count": a key can hold any byte, "/" and ".." included): read at setup, written
// by a closer at shutdown (so a successor worker, which waits for this one's lock, sees it).
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/escape.h"
#include "http/percent.h"
#include "worker/worker.h"
#include "ws/socket.h"

namespace {

using namespace corral;

class SlowAnswer;

// What GET /code shows: one set's version and its hello.txt, replaced together.
struct Code {
  std::string version;               // "" without code
  std::optional<std::string> hello;  // hello.txt's content, if the set has one
};

// A reload hook's refusal of a set: its own error code (redact below).
class ReloadFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Counter {
  int64_t count = 0;
  std::string path;
  std::multiset<uint64_t> busy_until;  // deadlines of /busy holds
  core::Timer busy_timer;
  std::multimap<uint64_t, SlowAnswer*> slow;  // /slow answers waiting for their deadline
  core::Timer slow_timer;                     // armed for the earliest of them
  uint64_t uploads_aborted = 0;               // /count bodies cut short
};

// POST /count: the body's bytes counted as they come, then {"bytes": n}. A buffered body (no
// stream: HTTP/3, in-process) is counted whole.
class CountUpload final : public http::DeferredProducer, private http::BodyConsumer {
 public:
  CountUpload(Counter& c, http::Request& req)
      : c_(c), stream_(req.body_stream), bytes_(req.body.size()) {}
  ~CountUpload() override {
    if (stream_) stream_->read(nullptr);
  }
  void start(http::Responder& responder) override {
    responder_ = &responder;
    if (!stream_) return answer();
    stream_->read(this);
  }
  void on_abort() override { responder_ = nullptr; }

 private:
  bool on_body_data(std::string_view piece) override {
    bytes_ += piece.size();
    return true;
  }
  void on_body_end() override {
    stream_ = nullptr;
    answer();
  }
  void on_body_abort(std::string_view why) override {
    stream_ = nullptr;
    ++c_.uploads_aborted;
    fprintf(stderr, "upload_aborted bytes=%llu why=\"%.*s\"\n",
            static_cast<unsigned long long>(bytes_), static_cast<int>(why.size()), why.data());
  }
  void answer() {
    if (auto* r = std::exchange(responder_, nullptr))
      r->respond(http::Response::json({{"bytes", bytes_}}));
  }
  Counter& c_;
  http::BodyStream* stream_;
  uint64_t bytes_;
  http::Responder* responder_ = nullptr;
};

// GET /slow: the answer comes from the Counter's timer at its deadline; until then the request
// is in flight. The Counter (which outlives every request) owns the timer, so an answer that the
// server destroys while answering never destroys a running timer.
class SlowAnswer final : public http::DeferredProducer {
 public:
  SlowAnswer(Counter& c, uint64_t deadline, uint64_t ms) : c_(c), deadline_(deadline), ms_(ms) {}
  ~SlowAnswer() override { drop(); }
  void start(http::Responder& responder) override {
    responder_ = &responder;
    at_ = c_.slow.emplace(deadline_, this);
    registered_ = true;
    c_.slow_timer.arm_at(c_.slow.begin()->first);
  }
  void on_abort() override { drop(); }
  // Called by the timer once this answer is out of c_.slow.
  void answer() {
    registered_ = false;
    responder_->respond(http::Response::text("slow " + std::to_string(ms_) + " ms\n"));
  }

 private:
  void drop() {
    if (!registered_) return;
    registered_ = false;
    c_.slow.erase(at_);
  }
  Counter& c_;
  uint64_t deadline_;
  uint64_t ms_;
  http::Responder* responder_ = nullptr;
  std::multimap<uint64_t, SlowAnswer*>::iterator at_;
  bool registered_ = false;
};

// The content of `dir`/`name`, or nullopt when there is none (no dir: a kind without code).
std::optional<std::string> read_code_file(std::string_view dir, const char* name) {
  if (dir.empty()) return std::nullopt;
  std::ifstream in(std::string(dir) + "/" + name, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The reload hook: the new set's hello.txt, or a refusal.
Code load_code(const worker::CodeUpdate& update) {
  if (auto ms = read_code_file(update.dir, "reload-sleep-ms")) {
    uint64_t n = 0;
    std::from_chars(ms->data(), ms->data() + ms->size(), n);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<uint64_t>(n, 60'000)));
  }
  if (read_code_file(update.dir, "reload-fails"))
    throw ReloadFailed("the set " + update.version + " has a file named reload-fails");
  return Code{update.version, read_code_file(update.dir, "hello.txt")};
}

void load(Counter& c) {
  std::ifstream in(c.path);
  if (in) in >> c.count;
}

void save(const Counter& c) {
  std::string tmp = c.path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << c.count << "\n";
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), c.path.c_str()) != 0)
    throw std::runtime_error("cannot rename to " + c.path);
}

// Every byte but the RFC 3986 unreserved ones as %XX, with a hash instead of the tail of a long
// one (as the lock's name): a bounded, safe file name for any address (core/escape.h).
std::string file_name_for(std::string_view address) {
  return core::bounded_file_name(address, 200);
}

uint64_t query_ms(std::string_view query) {
  // "ms=250" (and nothing else matters here)
  for (size_t at = 0; at < query.size();) {
    size_t end = query.find('&', at);
    if (end == std::string_view::npos) end = query.size();
    std::string_view kv = query.substr(at, end - at);
    if (kv.starts_with("ms=")) {
      uint64_t ms = 0;
      std::from_chars(kv.data() + 3, kv.data() + kv.size(), ms);
      return std::min<uint64_t>(ms, 60'000);
    }
    at = end + 1;
  }
  return 0;
}

}  // namespace

int main() {
  auto counter = std::make_unique<Counter>();
  Code code;
  worker::WorkerOptions options;
  options.redact = [](const std::exception& e) {
    if (dynamic_cast<const ReloadFailed*>(&e))
      return worker::PublicError{"the new code cannot be loaded", "reload_failed", ""};
    return worker::PublicError{"the counter failed", "counter_failed", ""};
  };
  const char* no_reload = getenv("CORRAL_NO_RELOAD");
  bool reloadable = !(no_reload && std::string_view(no_reload) == "1");
  return worker::worker_main(
      [&](worker::WorkerContext& ctx, http::SiteBuilder& site) {
        Counter& c = *counter;
        std::string dir = std::string(ctx.state_dir().empty() ? "." : ctx.state_dir()) + "/data";
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
          throw std::runtime_error("cannot create " + dir);
        c.path = dir + "/" + file_name_for(ctx.address()) + ".count";
        load(c);
        ctx.on_close([&c] { save(c); });
        // The timer belongs to the worker's loop, which is gone once worker_main returns.
        ctx.on_close([&c] { c.busy_timer.cancel(); });

        c.busy_timer.bind(ctx.loop().timers(), [&c, &ctx] {
          int done = 0;
          while (!c.busy_until.empty() && *c.busy_until.begin() <= ctx.loop().now()) {
            c.busy_until.erase(c.busy_until.begin());
            ++done;
          }
          if (!c.busy_until.empty()) c.busy_timer.arm_at(*c.busy_until.begin());
          ctx.busy_add(-done);
        });

        ctx.on_close([&c] { c.slow_timer.cancel(); });
        c.slow_timer.bind(ctx.loop().timers(), [&c, &ctx] {
          std::vector<SlowAnswer*> due;
          while (!c.slow.empty() && c.slow.begin()->first <= ctx.loop().now()) {
            due.push_back(c.slow.begin()->second);
            c.slow.erase(c.slow.begin());
          }
          if (!c.slow.empty()) c.slow_timer.arm_at(c.slow.begin()->first);
          for (SlowAnswer* a : due) a->answer();
        });

        code = Code{std::string(ctx.code_version()), read_code_file(ctx.code_dir(), "hello.txt")};
        if (reloadable) {
          // On the loop, between requests: no /code answer can see half of it.
          ctx.on_reload([&code](const worker::CodeUpdate& update) {
            code = load_code(update);
            return nlohmann::json{{"hello", code.hello ? nlohmann::json(*code.hello) : nullptr}};
          });
        }
        site.route("GET /code", [&code](http::Request&) {
          return http::Response::json(
              {{"version", code.version.empty() ? nlohmann::json() : nlohmann::json(code.version)},
               {"hello", code.hello ? nlohmann::json(*code.hello) : nlohmann::json()},
               {"pid", static_cast<int64_t>(getpid())}});
        });

        site.route("GET /", [&c](http::Request&) {
          return http::Response::text(std::to_string(c.count) + "\n");
        });
        site.route("POST /inc", [&c](http::Request&) {
          return http::Response::text(std::to_string(++c.count) + "\n");
        });
        // The query back: a request-specific answer (the proxy's pipelining tests).
        site.route(
            "POST /count",
            [&c](http::Request& req) {
              return http::Response::deferred(std::make_unique<CountUpload>(c, req));
            },
            http::RouteOptions{.stream_body = true, .max_body = uint64_t{1} << 40});
        site.route("GET /count/aborted", [&c](http::Request&) {
          return http::Response::text(std::to_string(c.uploads_aborted) + "\n");
        });
        site.route("GET /query", [](http::Request& req) {
          return http::Response::text(std::string(req.query) + "\n");
        });
        site.route("GET /trace", [](http::Request& req) {
          return http::Response::text(std::string(req.traceparent()) + "\n");
        });
        site.route("GET /start", [&ctx](http::Request&) {
          return http::Response::json({{"address", core::wire_encode(ctx.address())},
                                       {"start", ctx.start_data()},
                                       {"scripts", ctx.scripts()}});
        });
        site.route("GET /busy", [&c, &ctx](http::Request& req) {
          uint64_t ms = query_ms(req.query);
          ctx.busy_add(1);
          c.busy_until.insert(ctx.loop().now() + ms);
          c.busy_timer.arm_at(*c.busy_until.begin());
          return http::Response::text("busy " + std::to_string(ms) + " ms\n");
        });
        site.route("GET /block", [](http::Request& req) {
          uint64_t ms = query_ms(req.query);
          // Deliberately wrong: sleeping in a handler stops the whole loop (no other request, no
          // `pong`), as a stuck handler would. Tests of an unresponsive worker use it.
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          return http::Response::text("blocked " + std::to_string(ms) + " ms\n");
        });
        site.route("GET /slow", [&c, &ctx](http::Request& req) {
          uint64_t ms = query_ms(req.query);
          return http::Response::deferred(
              std::make_unique<SlowAnswer>(c, ctx.loop().now() + ms, ms));
        });
        // The proxy checked the client's Origin against the client's Host before relaying; here
        // the request's own origin is the proxy's (Host: localhost).
        ws::SocketRoute echo;
        echo.on_open = [](ws::Socket& sock) {
          sock.on_message = [](ws::Socket& s, std::string_view data, bool binary) {
            binary ? s.send_binary(data) : s.send_text(data);
          };
        };
        ws::add_socket_route(site, "/echo", std::move(echo));
        site.route("GET /crash", [](http::Request&) -> http::Response { std::abort(); });
        site.route("GET /fatal", [&ctx](http::Request&) {
          ctx.fatal(std::runtime_error("database refused password secret-123"));
          return http::Response::text("fatal\n", 500);
        });
      },
      std::move(options));
}
