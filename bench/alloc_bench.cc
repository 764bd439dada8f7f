// alloc_bench: heap allocations and time per request on corral's hot paths (Google Benchmark).
//
// A counting global operator new/delete sees every allocation in the process. The benchmarks:
//   BM_KeepAliveHello    an in-process Server on 127.0.0.1:0 serving GET /hello -> "hello"; one
//                        iteration = one request written by a blocking client socket in the same
//                        thread, the loop run until the whole response is back, the response read.
//   BM_PipelinedHello    the same with 16 requests per write; one iteration = 16 requests.
//   BM_ParseAndRoute     the sans-IO core alone: parser feed + router match + reset.
// Each reports `allocs_per_request`, counted after a warm-up (the first requests of a connection
// grow its buffers; later ones must not allocate). The target is 0.
//
// `--check-zero-alloc` (our flag, removed before Google Benchmark sees the arguments): exit 1 when
// any benchmark that ran counted an allocation per request. Allocation counts are deterministic;
// timings are reported but never checked. Single-threaded: the client, the server and the loop
// share the benchmark's thread.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/socket.h"
#include "http/parser.h"
#include "http/request.h"
#include "http/response.h"
#include "http/router.h"
#include "http/server.h"
#include "http/site.h"

// --- allocation counting ------------------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_allocs{0};
std::atomic<uint64_t> g_alloc_bytes{0};

void* counted_alloc(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_alloc_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* counted_aligned_alloc(std::size_t n, std::align_val_t al) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_alloc_bytes.fetch_add(n, std::memory_order_relaxed);
  std::size_t a = static_cast<std::size_t>(al);
  std::size_t size = (n + a - 1) / a * a;
  if (void* p = std::aligned_alloc(a, size ? size : a)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) {
  return counted_alloc(n);
}
void* operator new[](std::size_t n) {
  return counted_alloc(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t al) {
  return counted_aligned_alloc(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al) {
  return counted_aligned_alloc(n, al);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {

using namespace corral;

// The worst allocs_per_request of any benchmark that ran, for --check-zero-alloc.
double g_worst_allocs_per_request = 0;
const char* g_worst_name = "";
bool g_any_counted = false;

void report_allocs(benchmark::State& state, const char* name, uint64_t allocs, uint64_t bytes,
                   uint64_t requests) {
  double per = requests ? static_cast<double>(allocs) / static_cast<double>(requests) : 0;
  state.counters["allocs_per_request"] = per;
  state.counters["alloc_bytes_per_request"] =
      requests ? static_cast<double>(bytes) / static_cast<double>(requests) : 0;
  state.SetItemsProcessed(static_cast<int64_t>(requests));
  g_any_counted = true;
  if (per > g_worst_allocs_per_request) {
    g_worst_allocs_per_request = per;
    g_worst_name = name;
  }
}

std::shared_ptr<const http::Site> hello_site() {
  http::SiteBuilder b;
  b.route("GET /", [](http::Request&) { return http::Response::text("index"); });
  b.route("GET /hello", [](http::Request&) { return http::Response::text("hello"); });
  b.route("GET /users/{id}", [](http::Request&) { return http::Response::text("user"); });
  b.route("POST /echo", [](http::Request&) { return http::Response::text("echo"); });
  auto site = b.build();
  if (!site) {
    std::fprintf(stderr, "alloc_bench: site: %s\n", site.error().reason.c_str());
    std::exit(2);
  }
  return site.value();
}

// A server in this thread and one blocking client connection to it.
class Loopback {
 public:
  static constexpr std::string_view kRequest =
      "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: alloc_bench\r\nAccept: */*\r\n\r\n";

  Loopback()
      : devnull_(::open("/dev/null", O_WRONLY | O_CLOEXEC)),
        log_(devnull_, core::LogLevel::kWarn),
        server_(loop_, log_, options()) {
    auto addr = core::parse_address("127.0.0.1:0");
    auto bound = server_.listen(addr.value());
    if (!bound) fail("listen", bound.error().reason.c_str());
    server_.publish(hello_site());
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // connect() completes against the listen backlog; the server accepts in its next run_once.
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&bound->storage), bound->len) != 0)
      fail("connect", std::strerror(errno));
  }

  ~Loopback() {
    ::close(fd_);
    for (int i = 0; i < 10 && server_.stats().active > 0; ++i) loop_.run_once(10);
    ::close(devnull_);
  }

  // Writes `depth` requests in one write and runs the loop until `depth` whole responses are
  // read. Allocates nothing itself.
  void round_trip(int depth) {
    char req[16 * kRequest.size()];
    size_t len = 0;
    for (int i = 0; i < depth; ++i) {
      std::memcpy(req + len, kRequest.data(), kRequest.size());
      len += kRequest.size();
    }
    if (::send(fd_, req, len, MSG_NOSIGNAL) != static_cast<ssize_t>(len))
      fail("send", std::strerror(errno));
    int got = 0;
    while (got < depth) {
      got += take_responses();
      if (got < depth) {
        loop_.run_once(100);
        ssize_t n = ::recv(fd_, in_ + in_len_, sizeof in_ - in_len_, MSG_DONTWAIT);
        if (n == 0) fail("recv", "server closed the connection");
        if (n > 0) in_len_ += static_cast<size_t>(n);
      }
    }
  }

  uint64_t requests_served() const { return server_.stats().requests; }

 private:
  static http::ServerOptions options() {
    http::ServerOptions o;
    o.access_log = false;
    return o;
  }

  [[noreturn]] static void fail(const char* what, const char* why) {
    std::fprintf(stderr, "alloc_bench: %s: %s\n", what, why);
    std::exit(2);
  }

  // Consumes the whole responses at the front of in_; returns how many.
  int take_responses() {
    int n = 0;
    for (;;) {
      std::string_view buf(in_, in_len_);
      size_t end = buf.find("\r\n\r\n");
      if (end == std::string_view::npos) return n;
      std::string_view head = buf.substr(0, end);
      if (!head.starts_with("HTTP/1.1 200 ")) fail("response", std::string(head).c_str());
      size_t cl = head.find("\r\nContent-Length: ");
      if (cl == std::string_view::npos) fail("response", "no Content-Length");
      size_t body = std::strtoul(head.data() + cl + 18, nullptr, 10);
      size_t total = end + 4 + body;
      if (in_len_ < total) return n;
      std::memmove(in_, in_ + total, in_len_ - total);
      in_len_ -= total;
      ++n;
    }
  }

  int devnull_;
  core::EventLoop loop_;
  core::Logger log_;
  http::Server server_;
  int fd_ = -1;
  char in_[64 * 1024];
  size_t in_len_ = 0;
};

constexpr int kWarmupRequests = 64;

void run_loopback(benchmark::State& state, const char* name, int depth) {
  auto lb = std::make_unique<Loopback>();
  for (int i = 0; i < kWarmupRequests; ++i) lb->round_trip(depth);
  uint64_t allocs0 = g_allocs.load(), bytes0 = g_alloc_bytes.load();
  uint64_t served0 = lb->requests_served();
  for (auto _ : state) lb->round_trip(depth);
  uint64_t allocs = g_allocs.load() - allocs0, bytes = g_alloc_bytes.load() - bytes0;
  uint64_t served = lb->requests_served() - served0;
  if (served != static_cast<uint64_t>(state.iterations()) * static_cast<uint64_t>(depth)) {
    state.SkipWithError("the server did not count one request per request sent");
    return;
  }
  report_allocs(state, name, allocs, bytes, served);
}

void BM_KeepAliveHello(benchmark::State& state) {
  run_loopback(state, "BM_KeepAliveHello", 1);
}
BENCHMARK(BM_KeepAliveHello);

void BM_PipelinedHello(benchmark::State& state) {
  run_loopback(state, "BM_PipelinedHello", 16);
}
BENCHMARK(BM_PipelinedHello);

void BM_ParseAndRoute(benchmark::State& state) {
  std::vector<http::RouteDef> defs = {{"GET /", 0},
                                      {"GET /hello", 1},
                                      {"GET /users/{id}", 2},
                                      {"POST /echo", 3},
                                      {"GET /static/*", 4}};
  auto router = http::Router::build(std::move(defs));
  if (!router) {
    state.SkipWithError(router.error().reason.c_str());
    return;
  }
  http::ParserLimits limits;
  http::RequestParser parser(limits);
  http::Request req;
  std::string_view input = Loopback::kRequest;
  auto once = [&] {
    auto r = parser.feed(input, req);
    if (r.kind != http::RequestParser::Kind::kComplete) {
      std::fprintf(stderr, "alloc_bench: parser did not complete the request\n");
      std::exit(2);
    }
    auto m = router->match(req.method, req.method_name, req.path, req);
    benchmark::DoNotOptimize(m);
    if (m.kind != http::Router::MatchKind::kFound) {
      std::fprintf(stderr, "alloc_bench: /hello did not match\n");
      std::exit(2);
    }
    parser.next_request();
    req.reset();
  };
  for (int i = 0; i < kWarmupRequests; ++i) once();
  uint64_t allocs0 = g_allocs.load(), bytes0 = g_alloc_bytes.load();
  for (auto _ : state) once();
  report_allocs(state, "BM_ParseAndRoute", g_allocs.load() - allocs0, g_alloc_bytes.load() - bytes0,
                static_cast<uint64_t>(state.iterations()));
}
BENCHMARK(BM_ParseAndRoute);

}  // namespace

int main(int argc, char** argv) {
  bool check = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--check-zero-alloc") == 0) {
      check = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (check) {
    // The counter itself must see allocations, or "0 per request" would mean nothing.
    uint64_t before = g_allocs.load();
    auto probe = std::make_unique<std::string>(100, 'x');
    benchmark::DoNotOptimize(probe->data());
    if (g_allocs.load() == before) {
      std::fprintf(stderr,
                   "alloc_bench: --check-zero-alloc: the allocation counter is not hooked\n");
      return 1;
    }
    if (!g_any_counted) {
      std::fprintf(stderr, "alloc_bench: --check-zero-alloc: no benchmark ran\n");
      return 1;
    }
    if (g_worst_allocs_per_request > 0) {
      std::fprintf(stderr, "alloc_bench: --check-zero-alloc: %s allocates %.3f times per request\n",
                   g_worst_name, g_worst_allocs_per_request);
      return 1;
    }
    std::fprintf(stderr, "alloc_bench: --check-zero-alloc: 0 allocations per request\n");
  }
  return 0;
}
