#include "proxy/upstream_connection.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "proxy/pool.h"

namespace corral::proxy {

namespace {
constexpr std::string_view kLostWhy = "upstream connection lost";
}

UpstreamConnection::UpstreamConnection(core::EventLoop& loop, core::UniqueFd fd, std::string path,
                                       UpstreamPool* pool)
    : loop_(loop),
      pool_(pool),
      fd_(std::move(fd)),
      path_(std::move(path)),
      stall_(loop.timers(), [this] { rescue_behind(); }) {}

UpstreamConnection::~UpstreamConnection() {
  shut();
}

UpstreamConnection::Opened UpstreamConnection::open(core::EventLoop& loop, std::string_view path,
                                                    UpstreamPool* pool) {
  sockaddr_un sun{};
  if (path.size() >= sizeof sun.sun_path) return {nullptr, "upstream socket path too long"};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.data(), path.size());
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return {nullptr, "upstream unreachable", true};
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sun), sizeof sun) < 0) {
    // A Unix stream connect never completes later: EAGAIN is an accept queue that is full, and
    // the socket stays unconnected. Nothing left either way: safe to try again whatever the
    // method.
    if (errno == EAGAIN) return {nullptr, "upstream accept queue full", true, true};
    if (errno != EINPROGRESS) return {nullptr, "upstream unreachable", true};
  }
  auto c = adopt(loop, std::move(fd), std::string(path), pool);
  if (!c) return {nullptr, "epoll"};
  return {std::move(c)};
}

std::unique_ptr<UpstreamConnection> UpstreamConnection::adopt(core::EventLoop& loop,
                                                              core::UniqueFd fd, std::string path,
                                                              UpstreamPool* pool) {
  std::unique_ptr<UpstreamConnection> c(
      new UpstreamConnection(loop, std::move(fd), std::move(path), pool));
  if (!loop.add(c->fd_.get(), kIdleEvents, c.get())) return nullptr;
  c->interest_ = kIdleEvents;
  return c;
}

void UpstreamConnection::shut() {
  if (fd_ && interest_) loop_.remove(fd_.get());  // interest: registered
  interest_ = 0;
  fd_.reset();
}

// At most kMaxPipeline: only UpstreamPool::joinable adds one behind another, below that depth
// (and only on a connection that echoes).
void UpstreamConnection::push(std::unique_ptr<Exchange> ex) {
  ex->conn = this;
  ex->sent_ms = loop_.now();
  bool first = queue_.empty();
  append_request(*ex, first);
  queue_.push_back(std::move(ex));
  if (first) {
    pipelinable_ = queue_.front()->pipelinable;
    start_front();
  } else if (!stall_.armed()) {
    stall_.arm_after(kStallMs);  // the first response holds this one until it ends
  }
  if (pool_) {
    // The request goes out with the others of this loop round, so the upstream wakes once for
    // the lot, and the GETs of the round can be pipelined behind it.
    pool_->send_soon(this);
    return;
  }
  send();
}

// A request pipelined behind another carries a Corral-Seq its response must echo; so does the
// first GET or HEAD of a pooled connection, to learn whether the upstream echoes at all (its
// response need not). Both are GET or HEAD without a body: their bytes end with the head's empty
// line, before which the field goes. Others go as they are: they are never pipelined, and on a
// connection that echoes, a response that carries a Corral-Seq is not theirs.
void UpstreamConnection::append_request(Exchange& ex, bool first) {
  ex.behind = !first;
  ex.seq = 0;
  ex.out_begin = queued_;
  size_t before = out_.size();
  std::string_view request = ex.request;
  bool tag = pool_ && ex.pipelinable && (ex.behind || echo_ == Echo::kUnknown) &&
             request.ends_with("\r\n\r\n");
  if (tag) {
    ex.seq = pool_->next_seq();
    char field[40];
    int n = snprintf(field, sizeof field, "Corral-Seq: %llu\r\n\r\n",
                     static_cast<unsigned long long>(ex.seq));
    out_.append(request.substr(0, request.size() - 2)).append(field, static_cast<size_t>(n));
  } else {
    out_.append(request);
  }
  queued_ += out_.size() - before;
}

// The first exchange in the queue reads from now on (its predecessor's response ended).
void UpstreamConnection::start_front() {
  Exchange& ex = *queue_.front();
  if (ex.discard) return close(Loss{});  // its client is gone: no reading its answer to nothing
  reader_.start(ex, ex.head_request, ex.upgrade, ex.seq, ex.behind);
  if (queue_.size() > 1 && !stall_.armed()) stall_.arm_after(kStallMs);
}

void UpstreamConnection::on_io(uint32_t events) {
  if (closed_) return;
  if (queue_.empty()) {
    if (pool_) pool_->drop(this);  // idle: the upstream closed it, or sent what nobody asked for
    return;
  }
  if (events & EPOLLOUT) send();
  if (closed_) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read();
}

Loss UpstreamConnection::front_failure(std::string_view why) const {
  return Loss{502, why, !queue_.front()->got_bytes};
}

void UpstreamConnection::send() {
  if (closed_ || queue_.empty()) return;
  while (out_sent_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_, MSG_NOSIGNAL);
    if (n > 0) {
      queue_.front()->wrote = true;
      out_sent_ += static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    // A Unix connect that never completed: the request did not leave.
    if (n < 0 && errno == ENOTCONN) queue_.front()->never_sent = true;
    // Closed before a byte of it went (EPIPE on its first write): it never left. (A POST is
    // alone on its connection; after a partial write the upstream may have read a part.)
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET) && !queue_.front()->wrote)
      queue_.front()->unread = true;
    return close(front_failure("upstream write failed"));
  }
  bool done = out_sent_ == out_.size();
  if (done) {
    out_.clear();  // keeps its capacity for the connection's next requests
    out_sent_ = 0;
  } else if (out_sent_ >= kBodyHighWater) {
    // A streamed body appends while earlier bytes are still going: what was sent goes, so the
    // buffer stays within about twice the high-water mark.
    out_.erase(0, out_sent_);
    out_sent_ = 0;
  }
  if (!set_interest(done ? interest_ & ~static_cast<uint32_t>(EPOLLOUT) : interest_ | EPOLLOUT))
    return close(front_failure("epoll"));
  if (done && !queue_.empty() && queue_.front()->body_open) queue_.front()->on_drained();
}

bool UpstreamConnection::send_body(std::string_view piece, bool chunked) {
  if (closed_) return true;
  size_t before = out_.size();
  if (chunked) {
    char size[24];
    int n = snprintf(size, sizeof size, "%zx\r\n", piece.size());
    out_.append(size, static_cast<size_t>(n)).append(piece).append("\r\n");
  } else {
    out_.append(piece);
  }
  queued_ += out_.size() - before;
  // With a pool the head may still wait for this round's flush: it is ahead in out_, so sending
  // now keeps the order.
  send();
  return closed_ || out_.size() - out_sent_ < kBodyHighWater;
}

void UpstreamConnection::end_chunked_body() {
  if (closed_) return;
  out_.append("0\r\n\r\n");
  queued_ += 5;
  send();
}

void UpstreamConnection::read() {
  char buf[16384];
  ssize_t n = ::read(fd_.get(), buf, sizeof buf);
  if (n > 0) return feed(buf, static_cast<size_t>(n));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n < 0 && errno == ECONNRESET) queue_.front()->unread = true;  // closed with ours unread
  // Closed before a byte of the request went (the close was seen in the round the request was
  // queued, before the round's flush): it never left.
  if (queue_.size() == 1 && !queue_.front()->wrote) queue_.front()->unread = true;
  // EOF: a close-delimited body ends here; before the head it is a failure.
  if (!reader_.head_seen()) return close(front_failure("upstream closed before its response"));
  bool ok = reader_.finish() == ResponseReader::State::kComplete;
  queue_.front()->on_read(ok);
  if (closed_) return;
  if (!ok) return close(Loss{});  // cut short: the exchange ends what it started
  response_ended(nullptr, 0);
}

// Bytes from the connection: the first exchange's, and after its response's end, the next one's.
void UpstreamConnection::feed(const char* data, size_t n) {
  Exchange& ex = *queue_.front();
  if (written_ <= ex.out_begin) {
    // Read before a byte of its request left: not its answer (the previous response's excess,
    // or an idle connection's). Its request never left: it goes again, whatever its method.
    ex.unread = true;
    return close(Loss{502, "upstream sent bytes nobody asked for", true});
  }
  ex.got_bytes = true;
  auto fed = reader_.feed(data, n);
  switch (fed.state) {
    case ResponseReader::State::kMore:
    case ResponseReader::State::kComplete:
      ex.on_read(fed.state == ResponseReader::State::kComplete);
      if (closed_) return;
      if (fed.state == ResponseReader::State::kComplete)
        response_ended(data + fed.used, n - fed.used);
      return;
    case ResponseReader::State::kSwitched: {
      // The socket goes to the relay: the connection is done (an upgrade is never pipelined).
      auto self = queue_.take(0);  // the only one: an upgrade is not pipelined
      self->conn = nullptr;
      if (interest_) loop_.remove(fd_.get());
      interest_ = 0;
      closed_ = true;
      stall_.cancel();
      loop_.destroy_later(std::unique_ptr<UpstreamConnection>(this));  // owned itself while busy
      self->on_switch(std::move(fd_), std::string(data + fed.used, n - fed.used));
      loop_.destroy_later(std::move(self));
      return;
    }
    case ResponseReader::State::kError:
      if (reader_.not_its_response() || (ex.behind && !reader_.head_seen())) {
        // Another request's answer, or (behind another response) bytes that may be that
        // response's excess: nothing of its own came. Sent again (a GET or HEAD), on a fresh
        // connection.
        ex.got_bytes = false;
        return close(Loss{502, reader_.error(), true});
      }
      return close(Loss{502, reader_.error(), false});
  }
}

// The first response ended: the connection goes to the next exchange (with what came after the
// response), or back to the pool, or is closed. The ended exchange hears of its end last: that
// may drop its body, and the bytes after it are the next one's business.
void UpstreamConnection::response_ended(const char* rest, size_t rest_n) {
  stall_.cancel();
  auto ex = queue_.take(0);
  ex->conn = nullptr;
  uint64_t took = std::min<uint64_t>(loop_.now() - ex->sent_ms, 10'000);
  latency_x8_ = latency_x8_ - latency_x8_ / 8 + static_cast<uint32_t>(took);
  if (ex->seq && echo_ == Echo::kUnknown) echo_ = reader_.seq_echoed() ? Echo::kYes : Echo::kNo;
  // A response before the end of its streamed request body: the upstream has an unfinished
  // request on this connection, never to be reused.
  bool keep = reader_.keep_alive() && !ex->body_open;
  if (!queue_.empty() && keep) {
    start_front();
    if (!closed_ && rest_n > 0) feed(rest, rest_n);
  } else if (queue_.empty() && pool_ && reusable_ && rest_n == 0 && keep && out_.empty() &&
             set_interest(kIdleEvents)) {
    pool_->give(std::unique_ptr<UpstreamConnection>(this));  // stays registered
  } else {
    // The upstream closes it, or sent bytes after the last response (nobody's: never passed
    // on). Those pipelined behind are sent again.
    close(std::nullopt);
  }
  ex->on_end();
  loop_.destroy_later(std::move(ex));
}

bool UpstreamConnection::abandon(Exchange& ex, const Loss& loss) {
  if (closed_ || !front_is(ex)) return false;
  close(loss);
  return true;
}

void UpstreamConnection::rescue_behind() {
  if (queue_.size() < 2) return;
  reusable_ = false;  // the upstream still has those requests: their answers would follow
  if (pool_) pool_->stats().rescued += queue_.size() - 1;
  resend_behind();
}

// Every exchange behind the first leaves the queue and is sent again elsewhere (lost), or, if
// its client is gone, just ends. In order: the first behind goes first.
void UpstreamConnection::resend_behind(size_t from) {
  while (queue_.size() > from) {
    auto ex = queue_.take(from);
    ex->conn = nullptr;
    ex->reused = true;
    ex->got_bytes = false;
    Exchange* e = ex.get();
    e->lost(std::move(ex), Loss{502, kLostWhy, true});
  }
}

void UpstreamConnection::close(std::optional<Loss> front) {
  if (closed_) return;
  closed_ = true;
  stall_.cancel();
  shut();
  loop_.destroy_later(std::unique_ptr<UpstreamConnection>(this));  // owned itself while busy
  std::unique_ptr<Exchange> first;
  if (front && !queue_.empty()) {
    first = queue_.take(0);
  }
  resend_behind(0);  // the first is out: every one left is behind it
  if (first) {
    first->conn = nullptr;
    Exchange* e = first.get();
    e->lost(std::move(first), *front);
  }
}

void UpstreamConnection::pause_reading() {
  if (interest_ & EPOLLIN) (void)set_interest(interest_ & ~static_cast<uint32_t>(EPOLLIN));
}

void UpstreamConnection::resume_reading() {
  if (!closed_ && !(interest_ & EPOLLIN)) (void)set_interest(interest_ | EPOLLIN);
}

bool UpstreamConnection::set_interest(uint32_t want) {
  if (!fd_) return false;
  if (want == interest_) return true;
  interest_ = want;
  return static_cast<bool>(loop_.modify(fd_.get(), want, this));
}

}  // namespace corral::proxy
