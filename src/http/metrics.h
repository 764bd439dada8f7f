// ProcessMetrics: what one server process counts for GET /metrics (control/metrics.h renders the
// sum), and where it counts it.
//
// Design. Counts are exact and read on a scrape, not pushed: the supervisor maps one shared
// anonymous region (control::MetricsRegion, mmap MAP_SHARED|MAP_ANONYMOUS) before it forks, with
// one fixed-size ProcessMetrics block per (slot, generation index): fanout::kGenerations blocks
// per slot, the index a process's QUIC pair is chosen by too, which no two live processes share
// (fanout/supervisor.h). A server process points metrics() at its block before it serves
// (adopt_metrics) and from then on its loop thread alone writes it; the supervisor only reads.
//
//  * No lock, no syscall, no allocation on the request path: every word has one writer, which adds
//    to it with a relaxed atomic load and store of its own (add(): a plain load and store on
//    x86-64, no read-modify-write, no lock prefix); the reader loads each word relaxed. A scrape
//    is not one instant across words (a histogram's sum may be a request ahead of its buckets),
//    but each word only grows, and _count is the sum of the buckets as read.
//  * Reuse: a respawned process (same slot), or a later generation with the same index, takes the
//    block over and goes on counting in it: counters never go backwards, and nothing of a process
//    that is gone is lost or needs folding anywhere. Gauges (open connections, WebSockets) are the
//    exception: the new owner zeroes them, and the supervisor sums gauges over live processes only
//    (a crashed process's block still holds its last values).
//  * Bounded: the labels are the protocol, the status code (an array over 100..599), a fixed set of
//    reasons and the index of a worker kind in the region's kind table (kMetricsKinds at most);
//    no address, no path.
//
// Every other process (the supervisor itself, a worker built on http::Server, a unit test, a
// single server process with no supervisor) counts into a static block of its own that nothing
// reads: the counting code never checks whether anyone is listening. (A single process has no
// control API, hence no /metrics: an admin listener makes serve() run a supervisor, app/app.h.)
//
// Histograms have fixed buckets, in microseconds here (seconds on the wire): the Prometheus
// clients' defaults for request latency, longer ones for worker starts. Latencies are taken from
// EventLoop::now_us(), read once per loop iteration: a request answered within the iteration that
// read it counts 0, whatever took less than that.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace corral::http {

// Bucket upper bounds, microseconds. Requests: 5 ms .. 10 s (Prometheus' DefBuckets).
inline constexpr uint64_t kLatencyBoundsUs[] = {5'000,     10'000,    25'000,    50'000,
                                                100'000,   250'000,   500'000,   1'000'000,
                                                2'500'000, 5'000'000, 10'000'000};
// Worker starts (fork or bind to `ready`) and first responses: 5 ms .. 60 s.
inline constexpr uint64_t kStartBoundsUs[] = {
    5'000,     10'000,    25'000,    50'000,     100'000,    250'000,   500'000,
    1'000'000, 2'500'000, 5'000'000, 10'000'000, 30'000'000, 60'000'000};

// One writer per word (see above).
inline void add(uint64_t& word, uint64_t n = 1) noexcept {
  std::atomic_ref<uint64_t> a(word);
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
inline void add(int64_t& word, int64_t n) noexcept {
  std::atomic_ref<int64_t> a(word);
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
inline void store(int64_t& word, int64_t v) noexcept {
  std::atomic_ref<int64_t>(word).store(v, std::memory_order_relaxed);
}
template <typename T>
inline T load(const T& word) noexcept {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_relaxed);
}

// counts[i]: observations in (bounds[i-1], bounds[i]]; counts[N]: above the last bound. Not
// cumulative: the text format's buckets are the running sums (control/metrics.cc).
template <size_t N>
struct Histogram {
  static constexpr size_t kBounds = N;
  uint64_t counts[N + 1];
  uint64_t sum_us;

  void observe(const uint64_t (&bounds)[N], uint64_t us) noexcept {
    size_t i = 0;
    while (i < N && us > bounds[i]) ++i;
    add(counts[i]);
    add(sum_us, us);
  }
  // Adds `o` as read now (relaxed loads): the supervisor's sum of the blocks.
  void add_from(const Histogram& o) noexcept {
    for (size_t i = 0; i <= N; ++i) counts[i] += load(o.counts[i]);
    sum_us += load(o.sum_us);
  }
};
using LatencyHistogram = Histogram<std::size(kLatencyBoundsUs)>;
using StartHistogram = Histogram<std::size(kStartBoundsUs)>;

// Worker kinds with a first-response histogram of their own in every block (the region's kind
// table: the supervisor assigns each kind name an index once and keeps it; past this many,
// kinds are not counted there).
inline constexpr size_t kMetricsKinds = 16;

// One process's block: plain words only (zero is the initial state of every one; the region is
// zero-filled), no pointer, no padding that matters, the same layout in every process of the
// binary.
struct alignas(64) ProcessMetrics {
  enum Proto : uint8_t { kHttp1, kHttp3, kProtos };  // "1.1" (1.0 too), "3"
  static constexpr int kMinCode = 100, kMaxCode = 599;
  static constexpr size_t kCodes = kMaxCode - kMinCode + 1;  // requests[kCodes]: any other

  struct PerProto {
    uint64_t requests[kCodes + 1];  // by status code, at the response's end
    LatencyHistogram duration;      // request's first byte (HTTP/3: its stream) to response's end
    LatencyHistogram ttfb;          // ... to the response head
    uint64_t request_bytes;         // HTTP/1.1: every byte read (heads and bodies); HTTP/3: bodies
    uint64_t response_bytes;        // HTTP/1.1: every byte written; HTTP/3: bodies
    uint64_t connections;           // accepted (HTTP/3: handshakes completed)
  };
  PerProto proto[kProtos];
  uint64_t connections_refused;  // over max_connections
  uint64_t websockets;           // upgraded connections opened (WebSockets, relayed upgrades)

  enum ProxyError : uint8_t { kUnreachable, kTimeout, kBusy, kBroken, kCut, kProxyErrors };
  uint64_t proxy_errors[kProxyErrors];

  enum Forward : uint8_t { kToSlot, kToGeneration, kForwards };
  uint64_t quic_forwarded[kForwards];  // datagrams sent to their owner (quic/dispatch.h)

  // A cold proxied request (its worker was started for it): request's first byte to response
  // head, by the kind's index in the region's table.
  StartHistogram first_response[kMetricsKinds];

  // Zeroed by a process that takes the block over; summed over live processes only.
  struct Gauges {
    int64_t connections_open[kProtos];
    int64_t websockets_open;
  } gauges;

  void response_head(Proto p, uint64_t ttfb_us) noexcept {
    proto[p].ttfb.observe(kLatencyBoundsUs, ttfb_us);
  }
  void request_done(Proto p, int status, uint64_t duration_us) noexcept {
    size_t i =
        status >= kMinCode && status <= kMaxCode ? static_cast<size_t>(status - kMinCode) : kCodes;
    add(proto[p].requests[i]);
    proto[p].duration.observe(kLatencyBoundsUs, duration_us);
  }
};

namespace detail {
extern ProcessMetrics* current_metrics;
}

// This process's block: its own static one until adopt_metrics().
inline ProcessMetrics& metrics() noexcept {
  return *detail::current_metrics;
}
// From now on this process counts in `block` (its gauges zeroed: the previous owner is gone).
// `kinds`: the region's kind table, by index (metrics_kind's answers).
void adopt_metrics(ProcessMetrics* block, std::vector<std::string> kinds);
// The kind index of a worker address ("kind:key"), or -1.
int metrics_kind(std::string_view address);
// The microseconds from `start_us` to `now_us` (0 if the clock was not read in between).
inline uint64_t elapsed_us(uint64_t start_us, uint64_t now_us) noexcept {
  return now_us > start_us ? now_us - start_us : 0;
}

}  // namespace corral::http
