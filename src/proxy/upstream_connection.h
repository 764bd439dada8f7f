// UpstreamConnection: one HTTP/1.1 connection to an upstream on a Unix socket (a worker's), and
// the pipeline on it as an explicit queue of in-flight Exchanges, owned by the connection. The
// first exchange in the queue is the one whose response is being read (the ResponseReader's
// events go to it); those behind it were sent after it and wait for their turn. When a response
// ends, the next exchange reads the bytes that came after it.
//
// A response is only ever given to the request it answers. Bytes that came before a byte of the
// first exchange's request left (an idle connection's, or those after the last response) are
// nobody's answer: the connection closes. HTTP/1.1 cannot tell a pipelined request's response
// from one response too many to the request ahead of it, so a request is pipelined only on a
// connection whose upstream echoes the Corral-Seq field the connection adds to it (the worker
// libraries do; the first request of a connection asks), and its response must carry its own
// value: one that does not (another request's answer, or bytes that are no response) closes the
// connection, and the requests not yet answered on it are sent again (they are GET or HEAD).
//
// Lifetime: while the queue is not empty the connection owns itself (nothing else needs it, as
// the Relay); idle, its UpstreamPool owns it. A connection that closes (the upstream went away,
// an error, the first exchange's client left or timed out) hands each exchange back to itself
// (Exchange::lost, with ownership), then is destroyed after the loop round (destroy_later), so an
// event for it later in the same epoll batch finds live memory. It is registered with the loop
// for its whole life, with itself as the handler: moving between the pool and its users costs no
// epoll_ctl. Single-threaded.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/event_loop.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"
#include "proxy/fields.h"
#include "proxy/response_reader.h"

namespace corral::proxy {

class UpstreamConnection;
class UpstreamPool;

// Why a connection gave an exchange back before its response ended.
struct Loss {
  int status = 0;  // 0: the exchange itself closed the connection (it has answered, or is gone)
  std::string_view why;
  bool retryable = false;  // nothing of a response came: sending it again may be safe
};

// One request on a connection and the response to it. The connection calls the events below; the
// proxy (proxy.cc) implements them. The fields are the request's, set before it is queued; the
// connection updates the flags.
class Exchange : public ResponseReader::Events {
 public:
  virtual ~Exchange() = default;
  // After each read whose bytes went to this exchange (the head may have come with its body).
  virtual void on_read(bool complete) = 0;
  // The response ended. The exchange is out of the queue; the connection destroys it after the
  // loop round. (One cut short by the upstream's close comes back through lost(), status 0.)
  virtual void on_end() = 0;
  // The upstream switched protocols (a requested 101): its socket and what came after the head.
  virtual void on_switch(core::UniqueFd upstream, std::string leftover) = 0;
  // The connection gave this exchange back (`self`) before its response ended: send it again,
  // answer an error, or drop it (destroy_later: this may run inside its own callback).
  virtual void lost(std::unique_ptr<Exchange> self, const Loss& loss) = 0;
  // Everything queued on the connection was written (a streamed request body may go on).
  virtual void on_drained() {}

  std::string request;  // its bytes, kept whole for a retry on another connection
  bool head_request = false;
  bool pipelinable = false;  // a GET or HEAD without a body: others may follow it on the connection
  bool upgrade = false;
  bool discard = false;     // nobody takes its response any more: read to nothing
  bool reused = false;      // on a connection that was there before it (pooled, or pipelined)
  bool got_bytes = false;   // the upstream sent something for it (a retry could repeat work)
  bool never_sent = false;  // the connect failed: the request did not leave
  // The upstream provably did not read the whole request: a write failed with EPIPE (its end
  // was closed before the bytes went), or a read failed with ECONNRESET (a Unix socket closed
  // with bytes still unread in it). After a plain EOF it may have read and acted on it.
  bool unread = false;
  bool wrote = false;  // a byte went out on its connection while it was first in the queue
  // Set by the connection's push: the Corral-Seq its request carries there (0: none), whether it
  // was queued behind another (pipelined: its response must echo `seq`), and where its request
  // begins in the connection's output (bytes, counted from the connection's start).
  uint64_t seq = 0;
  bool behind = false;
  uint64_t out_begin = 0;
  // Its request body is streamed after `request` (the head) and has not ended: the connection
  // is never reused (its upstream has an unfinished request) and nothing is pipelined behind it.
  bool body_open = false;
  uint64_t sent_ms = 0;                // when it was queued (latency: to its response's end)
  UpstreamConnection* conn = nullptr;  // while in a connection's queue
};

// The in-flight exchanges of a connection, in order, inline: at most kMaxPipeline are pipelined on
// one connection, so queueing one allocates nothing.
class ExchangeQueue {
 public:
  static constexpr uint32_t kMaxPipeline = 8;
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  std::unique_ptr<Exchange>& front() { return items_[0]; }
  const std::unique_ptr<Exchange>& front() const { return items_[0]; }
  void push_back(std::unique_ptr<Exchange> ex) { items_[size_++] = std::move(ex); }
  // Removes the `i`-th; those after it move up.
  std::unique_ptr<Exchange> take(size_t i) {
    auto ex = std::move(items_[i]);
    for (size_t k = i + 1; k < size_; ++k) items_[k - 1] = std::move(items_[k]);
    --size_;
    return ex;
  }

 private:
  std::unique_ptr<Exchange> items_[kMaxPipeline];
  size_t size_ = 0;
};

class UpstreamConnection final : public core::IoHandler {
 public:
  static constexpr uint32_t kIdleEvents = EPOLLIN | EPOLLRDHUP;
  static constexpr uint32_t kMaxPipeline = ExchangeQueue::kMaxPipeline;
  // Requests pipelined behind a response that has not ended after this long are sent again on
  // other connections (they are GET or HEAD: safe to repeat), and this one is not reused.
  static constexpr uint32_t kStallMs = 20;

  struct Opened {
    std::unique_ptr<UpstreamConnection> conn;
    std::string_view why;      // when conn is null
    bool unreachable = false;  // the connect itself failed: nothing left
    bool busy = false;         // ... because the upstream's accept queue is full (EAGAIN)
  };
  // A non-blocking connect to `path`, registered with `loop` (interest kIdleEvents). `pool`: where
  // it goes back when idle (null: closed after its response).
  static Opened open(core::EventLoop& loop, std::string_view path, UpstreamPool* pool);
  // An already connected socket (tests: a dead one for the pool), registered the same way.
  static std::unique_ptr<UpstreamConnection> adopt(core::EventLoop& loop, core::UniqueFd fd,
                                                   std::string path, UpstreamPool* pool);
  ~UpstreamConnection();
  UpstreamConnection(const UpstreamConnection&) = delete;
  UpstreamConnection& operator=(const UpstreamConnection&) = delete;

  // Queues `ex` (its request goes at the end of the output) and owns it. The first one on an
  // idle connection starts its reader. With a pool the bytes leave with the others of this loop
  // round (UpstreamPool::send_soon); without, at once.
  void push(std::unique_ptr<Exchange> ex);
  // The requests queued so far leave now (the pool's flush).
  void send();
  // A piece of the first exchange's streamed request body (`chunked`: framed as one chunk), sent
  // at once. False: the bytes not yet written passed kBodyHighWater; the exchange hears
  // on_drained() once all are out. The last chunk: end_chunked_body().
  bool send_body(std::string_view piece, bool chunked);
  void end_chunked_body();
  static constexpr size_t kBodyHighWater = 128 * 1024;
  // The body's reader cannot take more (backpressure) / can again.
  void pause_reading();
  void resume_reading();
  // `ex` (in this queue) gives up on its response (its client left, or it timed out). The first
  // closes the connection, those behind are sent again, and `ex` comes back through
  // lost(`loss`): true. One behind stays in the queue, its response read to nothing: false.
  bool abandon(Exchange& ex, const Loss& loss);
  // The requests behind the first are sent again on other connections (the first holds them: a
  // stream, or a response slower than kStallMs); this one is closed after the first's response.
  void rescue_behind();
  // Leaves the loop and closes the socket of an idle connection (the pool drops it).
  void shut();

  bool front_is(const Exchange& ex) const { return !queue_.empty() && queue_.front().get() == &ex; }
  size_t depth() const { return queue_.size(); }
  bool idle() const { return queue_.empty(); }
  bool open() const { return static_cast<bool>(fd_); }
  bool pipelinable() const { return pipelinable_; }
  // Its upstream echoed the Corral-Seq of a request: requests may be pipelined on it.
  bool echoes() const { return echo_ == Echo::kYes; }
  void set_pipelinable(bool p) { pipelinable_ = p; }
  bool reusable() const { return reusable_; }
  uint32_t latency_x8() const { return latency_x8_; }  // responses on it, EWMA, ms*8
  const std::string& path() const { return path_; }
  UpstreamPool* pool() const { return pool_; }
  bool scheduled = false;  // UpstreamPool::send_soon: its requests leave after this round

  void on_io(uint32_t events) override;

 private:
  UpstreamConnection(core::EventLoop& loop, core::UniqueFd fd, std::string path,
                     UpstreamPool* pool);
  void read();
  void feed(const char* data, size_t n);
  void response_ended(const char* rest, size_t rest_n);
  void append_request(Exchange& ex, bool first);
  void start_front();
  bool set_interest(uint32_t want);
  // Closes: the first exchange is given back with `front`, those behind as lost (sent again);
  // without `front`, every exchange in the queue is behind (the first's response has ended).
  void close(std::optional<Loss> front);
  void resend_behind(size_t from = 1);  // the exchanges from `from` on
  Loss front_failure(std::string_view why) const;

  core::EventLoop& loop_;
  UpstreamPool* pool_;
  core::UniqueFd fd_;
  std::string path_;
  uint32_t interest_ = 0;  // as registered with the loop
  std::string out_;        // requests not sent yet (from out_sent_)
  size_t out_sent_ = 0;
  uint64_t queued_ = 0;   // bytes ever appended to out_
  uint64_t written_ = 0;  // bytes ever written to the socket
  enum class Echo : uint8_t { kUnknown, kYes, kNo };
  Echo echo_ = Echo::kUnknown;  // whether the upstream echoes Corral-Seq (learned once)
  ExchangeQueue queue_;         // in flight, in order
  // Stores only the fields the proxy passes on: the others cost no copy (fields.h).
  ResponseReader reader_{dropped_response_header};
  core::Timer stall_;  // while requests wait behind a response that has not ended
  uint32_t latency_x8_ = 0;
  bool pipelinable_ = false;  // every request on it is a GET or HEAD without a body
  bool reusable_ = true;      // false: closed once its current response ends (after a rescue)
  bool closed_ = false;
};

}  // namespace corral::proxy
