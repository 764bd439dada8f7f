#include "http/proxy.h"

#include <errno.h>
#include <llhttp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/buffer.h"
#include "core/event_loop.h"
#include "core/timer_wheel.h"
#include "core/unique_fd.h"
#include "http/server.h"
#include "tls/session.h"

namespace corral::http {

void UpstreamPool::Conn::on_io(uint32_t events) {
  if (user) {
    user->on_io(events);
  } else if (pool) {
    pool->drop(this);  // idle: the upstream closed it, or sent what nobody asked for
  }
}

UpstreamPool::UpstreamPool(core::EventLoop& loop) : loop_(loop) {}

UpstreamPool::~UpstreamPool() {
  for (auto& [path, list] : idle_)
    for (auto& c : list) loop_.remove(c->fd.get());
}

std::unique_ptr<UpstreamPool::Conn> UpstreamPool::take(const std::string& path) {
  auto it = idle_.find(path);
  if (it == idle_.end() || it->second.empty()) return {};
  auto c = std::move(it->second.back());
  it->second.pop_back();
  c->pool = nullptr;
  return c;
}

void UpstreamPool::give(std::unique_ptr<Conn> c) {
  auto& list = idle_[c->path];
  if (list.size() >= kMaxIdlePerPath) {
    loop_.remove(c->fd.get());
    c->fd.reset();
    loop_.destroy_later(std::move(c));  // an event for it may be queued in this batch
    return;
  }
  c->user = nullptr;
  c->pool = this;
  c->tail = nullptr;
  c->depth = 0;
  c->pipelinable = false;
  c->scheduled = false;
  c->out.clear();
  c->out_sent = 0;
  list.push_back(std::move(c));
}

void UpstreamPool::send_soon(Conn* c) {
  if (c->scheduled) return;
  c->scheduled = true;
  to_send_.push_back(c);
  if (to_send_.size() > 1) return;  // the flush is scheduled
  loop_.defer([this] {
    // Conns closed this round are still alive (destroyed after the deferred functions) and have
    // no user any more.
    sending_.swap(to_send_);
    for (Conn* c : sending_) c->scheduled = false;
    for (Conn* c : sending_)
      if (c->user && c->fd) c->user->on_io(EPOLLOUT);
    sending_.clear();
  });
}

UpstreamPool::Conn* UpstreamPool::joinable(std::string_view path) {
  for (Conn* c : to_send_)  // all scheduled: their requests have not left yet
    if (c->pipelinable && c->reusable && c->user && c->fd && c->tail && c->depth < kMaxPipeline &&
        c->latency_x8 < 8 * kFastMs && c->path == path)
      return c;
  return nullptr;
}

size_t UpstreamPool::idle() const {
  size_t n = 0;
  for (const auto& [path, list] : idle_) n += list.size();
  return n;
}

void UpstreamPool::drop(Conn* c) {
  auto it = idle_.find(c->path);
  if (it == idle_.end()) return;
  auto& list = it->second;
  for (size_t k = 0; k < list.size(); ++k) {
    if (list[k].get() != c) continue;
    loop_.remove(c->fd.get());
    c->fd.reset();
    c->pool = nullptr;
    loop_.destroy_later(std::move(list[k]));
    list.erase(list.begin() + static_cast<long>(k));
    break;
  }
  if (list.empty()) idle_.erase(it);
}

namespace {

// By length first: one or two comparisons per header instead of a dozen calls (this runs for
// every header of every proxied request and response).
bool hop_by_hop(std::string_view name) {
  switch (name.size()) {
    case 2:
      return iequals(name, "te");
    case 7:
      return iequals(name, "trailer") || iequals(name, "upgrade");
    case 10:
      return iequals(name, "connection") || iequals(name, "keep-alive");
    case 16:
      return iequals(name, "proxy-connection");
    case 17:
      return iequals(name, "transfer-encoding");
    case 18:
      return iequals(name, "proxy-authenticate");
    case 19:
      return iequals(name, "proxy-authorization");
    default:
      return false;
  }
}

// Response headers the proxy does not pass on: hop-by-hop, the framing, and those the front adds
// itself (Date, Server and the default security headers).
bool dropped_response_header(std::string_view name) {
  switch (name.size()) {
    case 4:
      return iequals(name, "date");
    case 6:
      return iequals(name, "server");
    case 14:
      return iequals(name, "content-length");
    case 15:
      return iequals(name, "referrer-policy");
    case 22:
      return iequals(name, "x-content-type-options");
    default:
      return hop_by_hop(name);
  }
}

bool corral_header(std::string_view name) {
  return name.size() >= 7 && iequals(name.substr(0, 7), "corral-");
}

// Asked before answering 502 for an upstream that could not be reached or closed before sending
// anything: true means the owner tries again (the Upstream then stays silent). Only asked while
// the Upstream still has its Responder, so while its owner (the deferred producer) lives.
struct RetryHook {
  virtual bool retry_before_head() = 0;

 protected:
  ~RetryHook() = default;
};

// The upstream exchange. shared: the DeferredProducer owns it until the head arrives, then the
// StreamProducer that carries the body does; either may be dropped first by the connection.
//
// Pipelining: a GET or HEAD without a body may join a pooled connection whose requests leave in
// this loop round (UpstreamPool::joinable), behind the last request on it: that one then owns
// it through next_. The request that owns the connection (conn_) reads from it; when its response
// ends, it hands the connection and the bytes after its response to next_. A response that turns
// out to be a stream, or has not ended after kStallMs, would hold the requests behind it: they
// are sent again elsewhere (rescue) and the connection is closed after that response. If the
// connection fails, those behind are sent again on a fresh one (they never got a byte).
class Upstream final : public core::IoHandler, public std::enable_shared_from_this<Upstream> {
 public:
  Upstream(core::EventLoop& loop, std::string path, std::string request, uint32_t timeout_ms,
           bool head, bool upgrade = false, UpstreamPool* pool = nullptr, bool pipelinable = false)
      : loop_(loop),
        pool_(upgrade ? nullptr : pool),
        upgrade_requested_(upgrade),
        pipelinable_(pipelinable && !upgrade),
        path_(std::move(path)),
        timer_(loop.timers(),
               [this] {
                 auto self = shared_from_this();  // answering may drop the last other owner
                 fail(504, "upstream response timeout");
               }),
        stall_(loop.timers(),
               [this] {
                 auto self = shared_from_this();
                 rescue_behind();
               }),
        head_request_(head) {
    request_ = std::move(request);
    llhttp_settings_init(&settings_);
    settings_.on_status = nullptr;
    // A header's name is a view into the read buffer while it arrives in one piece (it nearly
    // always does); one split across reads is copied (keep_name). Only the values of headers
    // that are passed on are kept.
    settings_.on_header_field = [](llhttp_t* p, const char* at, size_t n) {
      auto* u = static_cast<Upstream*>(p->data);
      if (u->name_.empty()) {
        u->name_ = {at, n};
      } else {
        u->keep_name();
        u->name_copy_.append(at, n);
        u->name_ = u->name_copy_;
      }
      return 0;
    };
    settings_.on_header_field_complete = [](llhttp_t* p) {
      auto* u = static_cast<Upstream*>(p->data);
      u->is_type_ = iequals(u->name_, "content-type");
      u->keep_ = !u->is_type_ && (u->upgrade_requested_ || !dropped_response_header(u->name_));
      if (u->keep_) u->headers_.emplace_back(u->name_, std::string());  // an upgrade keeps all
      if (u->is_type_) u->content_type_.clear();
      return 0;
    };
    settings_.on_header_value = [](llhttp_t* p, const char* at, size_t n) {
      auto* u = static_cast<Upstream*>(p->data);
      if (u->keep_) {
        u->headers_.back().second.append(at, n);
      } else if (u->is_type_) {
        u->content_type_.append(at, n);
      }
      return 0;
    };
    settings_.on_header_value_complete = [](llhttp_t* p) {
      auto* u = static_cast<Upstream*>(p->data);
      u->name_ = {};
      u->name_copy_.clear();
      u->keep_ = u->is_type_ = false;
      return 0;
    };
    settings_.on_headers_complete = [](llhttp_t* p) {
      auto* u = static_cast<Upstream*>(p->data);
      if (u->upgrade_requested_ && p->status_code == 101) {
        u->switching_ = true;
        return 2;  // the rest is the upgraded protocol: llhttp pauses after the head
      }
      if (p->status_code == 101) return -1;  // a switch nobody asked for: malformed (502)
      if (p->status_code < 200) {
        // An interim response (100 Continue, 102, 103 Early Hints; RFC 9110 §15.2): not the
        // answer, which follows on the same connection. Read past (the front already sent the
        // client its own 100 Continue, see prepare_request); the response timeout keeps running
        // (a worker that only ever sends 102 gets 504), and a flood of them is malformed.
        u->headers_.clear();
        u->content_type_.clear();
        u->interim_ = true;
        return ++u->interims_ > kMaxInterim ? -1 : 1;  // 1: a 1xx has no content, whatever it says
      }
      u->on_head();
      return u->head_request_ ? 1 : 0;  // a response to HEAD has no body
    };
    settings_.on_body = [](llhttp_t* p, const char* at, size_t n) {
      static_cast<Upstream*>(p->data)->on_body({at, n});
      return 0;
    };
    settings_.on_message_complete = [](llhttp_t* p) {
      auto* u = static_cast<Upstream*>(p->data);
      if (u->switching_) return 0;  // a 101 "completes" at once: the socket goes on
      if (u->interim_) {
        u->interim_ = false;
        return 0;  // the final response is parsed next
      }
      u->complete_ = true;
      // What follows is the next pipelined request's response (feed), or nobody's.
      return static_cast<int>(HPE_PAUSED);
    };
    llhttp_init(&parser_, HTTP_RESPONSE, &settings_);
    parser_.data = this;
    timeout_ms_ = timeout_ms;
  }
  ~Upstream() { close_fd(); }

  void start(Responder& responder) {
    responder_ = &responder;
    timer_.arm_after(timeout_ms_);
    sent_ms_ = loop_.now();
    if (pool_ && pipelinable_) {
      if (UpstreamPool::Conn* c = pool_->joinable(path_)) {
        // Behind the last request on it; the owner of the connection sends ours with its own.
        auto* tail = static_cast<Upstream*>(c->tail);
        tail->next_ = shared_from_this();
        c->tail = this;
        ++c->depth;
        c->out.append(request_);
        reused_ = true;  // a connection that fails before answering us: sent again (fail)
        ++pool_->stats().pipelined;
        if (tail->conn_ && !tail->stall_.armed()) tail->stall_.arm_after(UpstreamPool::kStallMs);
        return;
      }
    }
    sockaddr_un sun{};
    if (path_.size() >= sizeof sun.sun_path) return fail(502, "upstream socket path too long");
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, path_.c_str(), path_.size() + 1);
    if (pool_) conn_ = pool_->take(path_);
    reused_ = conn_ != nullptr;
    if (!conn_) {
      conn_ = std::make_unique<UpstreamPool::Conn>();
      conn_->path = path_;
      conn_->fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!conn_->fd ||
          ::connect(conn_->fd.get(), reinterpret_cast<sockaddr*>(&sun), sizeof sun) < 0) {
        if (errno != EAGAIN && errno != EINPROGRESS) {
          never_sent_ = true;  // nothing left: safe to try again whatever the method
          return fail(502, "upstream unreachable", true);
        }
      }
      if (!loop_.add(fd(), UpstreamPool::kIdleEvents, conn_.get())) return fail(502, "epoll");
      conn_->interest = UpstreamPool::kIdleEvents;
    }
    conn_->user = this;
    conn_->tail = this;
    conn_->depth = 1;
    conn_->pipelinable = pipelinable_;
    conn_->out.append(request_);
    if (pool_) {
      // The request goes out with the others of this loop round (UpstreamPool::send_soon), so
      // the upstream wakes once for the lot, and GETs of the round can be pipelined behind it.
      pool_->send_soon(conn_.get());
      return;
    }
    on_io(EPOLLOUT);  // sends at once
  }

  RetryHook* retry_hook = nullptr;

  // The body's side, once the head was passed on.
  void attach_writer(StreamWriter* w) {
    writer_ = w;
    if (!w) {  // the client is gone
      abort();
      return;
    }
    if (!pending_body_.empty()) {
      std::string pending = std::move(pending_body_);
      pending_body_.clear();
      if (!writer_->write(pending)) pause_reading();
    }
    if (complete_) finish_body();
  }
  void resume() {
    if (conn_ && !(conn_->interest & EPOLLIN)) (void)set_interest(conn_->interest | EPOLLIN);
  }
  // The client is gone. A request still behind another on a pipelined connection stays there
  // and reads its response to nothing; one that owns the connection closes it (those behind it
  // are sent again elsewhere).
  void abort() {
    responder_ = nullptr;
    writer_ = nullptr;
    discard_ = true;
    pending_body_.clear();
    close_fd();
  }

 private:
  void on_io(uint32_t events) override {
    if (!conn_) return;
    if (events & EPOLLOUT) {
      auto& c = *conn_;
      while (c.out_sent < c.out.size()) {
        ssize_t n =
            ::send(fd(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
        if (n > 0) {
          c.out_sent += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n < 0 && errno == ENOTCONN) never_sent_ = true;  // a Unix connect that never completed
        return fail(502, "upstream write failed", !got_bytes_);
      }
      bool done = c.out_sent == c.out.size();
      if (done) {
        c.out.clear();  // keeps its capacity for the connection's next requests
        c.out_sent = 0;
      }
      // Also reached from start() and UpstreamPool::send_soon's flush, without EPOLLOUT.
      if (!set_interest(done ? c.interest & ~static_cast<uint32_t>(EPOLLOUT)
                             : c.interest | EPOLLOUT))
        return fail(502, "epoll", !got_bytes_);
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      char buf[16384];
      ssize_t n = ::read(fd(), buf, sizeof buf);
      if (n > 0) {
        auto self = shared_from_this();  // callbacks may drop the last other owner
        feed(buf, static_cast<size_t>(n));
        return;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      // EOF: a close-delimited body ends here; before the head it is a failure.
      if (!head_seen_) return fail(502, "upstream closed before its response", !got_bytes_);
      if (llhttp_message_needs_eof(&parser_)) llhttp_finish(&parser_);
      if (head_waits_) answer_head();
      if (!complete_) {
        // Cut short: the client must not take a truncated body for a whole one.
        close_fd();
        if (writer_) {
          auto* w = writer_;
          writer_ = nullptr;
          w->end();  // chunked: terminated; a Content-Length body stays short and the client sees
                     // it
        }
        return;
      }
      finish();
    }
  }

  // Bytes from the connection: ours, and after our response's end, the next pipelined one's.
  void feed(const char* data, size_t n) {
    got_bytes_ = true;
    llhttp_errno_t err = llhttp_execute(&parser_, data, n);
    if (!name_.empty()) keep_name();  // a name cut by the end of this read
    if (head_waits_ && (err == HPE_OK || complete_)) answer_head();
    if (switching_ && err == HPE_PAUSED_UPGRADE) {
      const char* end = llhttp_get_error_pos(&parser_);
      on_switch(std::string(end, static_cast<size_t>(data + n - end)));
      return;
    }
    if (complete_) {
      const char* end = err == HPE_PAUSED ? llhttp_get_error_pos(&parser_) : data + n;
      finish(end, static_cast<size_t>(data + n - end));
      return;
    }
    if (err != HPE_OK) fail(502, "malformed upstream response");
  }

  // Our response ended: the connection goes to the request pipelined behind us (with what came
  // after our response), or back to the pool, or is closed.
  // The stream's end goes last: it may drop the Body, and with it us.
  void finish(const char* rest = nullptr, size_t rest_n = 0) {
    stall_.cancel();
    if (conn_) {
      uint64_t took = std::min<uint64_t>(loop_.now() - sent_ms_, 10'000);
      conn_->latency_x8 = conn_->latency_x8 - conn_->latency_x8 / 8 + static_cast<uint32_t>(took);
      bool keep = llhttp_should_keep_alive(&parser_);
      if (next_ && keep) {
        auto next = std::move(next_);
        conn_->user = next.get();
        --conn_->depth;
        next->take_over(std::move(conn_), rest, rest_n);
      } else if (!next_ && pool_ && conn_->reusable && rest_n == 0 && keep && conn_->out.empty() &&
                 set_interest(UpstreamPool::kIdleEvents)) {
        conn_->user = nullptr;
        pool_->give(std::move(conn_));  // stays registered
      } else {
        close_fd();  // the upstream closes it: those pipelined behind us are sent again
      }
    }
    if (writer_) finish_body();
  }

  // The request before ours on the connection has its response: the connection is ours now.
  void take_over(std::unique_ptr<UpstreamPool::Conn> c, const char* rest, size_t rest_n) {
    conn_ = std::move(c);
    if (discard_) {  // our client is gone: no reading our response to nothing
      auto self = shared_from_this();
      close_fd();
      return;
    }
    if (next_) stall_.arm_after(UpstreamPool::kStallMs);
    if (rest_n > 0) {
      auto self = shared_from_this();
      feed(rest, rest_n);
    }
  }

  // The requests pipelined behind ours are sent again on other connections (ours holds them: a
  // stream, or a response slower than kStallMs); the upstream still has them, so this connection
  // is closed after our response instead of reused.
  void rescue_behind() {
    if (!next_) return;
    if (conn_) conn_->reusable = false;
    if (pool_)
      for (Upstream* m = next_.get(); m; m = m->next_.get()) ++pool_->stats().rescued;
    resend_behind();
  }

  // Every request behind ours leaves the connection and starts again (fail's retry: a fresh
  // connection), or, if its client is gone, just ends.
  void resend_behind() {
    auto m = std::move(next_);
    if (conn_) conn_->tail = this;
    while (m) {
      auto after = std::move(m->next_);
      m->reused_ = true;
      m->got_bytes_ = false;
      if (!m->discard_) m->fail(502, "upstream connection lost", true);
      m = std::move(after);
    }
  }

  void on_head() {
    head_seen_ = true;
    timer_.cancel();
    int status = parser_.status_code;
    Response r;
    r.status = status;
    // Filtered while parsed already, except for an upgrade request, which kept them all for a
    // 101 that did not come.
    for (auto& [k, v] : headers_)
      if (!dropped_response_header(k)) r.headers.emplace_back(std::move(k), std::move(v));
    headers_.clear();
    bool no_body = head_request_ || status == 204 || status == 304 || status < 200;
    if (no_body) {
      r.set_content_type(std::move(content_type_));
      if (head_request_ && (parser_.flags & F_CONTENT_LENGTH))
        r.header("Content-Length", std::to_string(parser_.content_length));
      respond(std::move(r));
      return;
    }
    pending_head_ = std::move(r);
    if (parser_.flags & F_CONTENT_LENGTH) {
      length_ = parser_.content_length;  // llhttp counts it down as the body comes
      // A body of known length often came in the same read as the head: see after this read
      // (answer_head) whether it is whole, and answer it as plain bytes if so.
      head_waits_ = true;
      return;
    }
    answer_head();  // chunked or until close: streamed
  }

  // The head is in; the body is whole (one response) or still coming (a stream that carries it,
  // with backpressure).
  void answer_head() {
    head_waits_ = false;
    Response r = std::move(pending_head_);
    if (discard_) return;
    if (complete_) {
      Response whole = Response::bytes(std::move(pending_body_), {}, r.status);
      if (content_type_.empty()) {
        whole.set_content_type_static("application/octet-stream");
      } else {
        whole.set_content_type(std::move(content_type_));
      }
      whole.headers = std::move(r.headers);
      respond(std::move(whole));
      return;
    }
    rescue_behind();  // a stream: nothing pipelined waits for its end
    class Body final : public StreamProducer {
     public:
      explicit Body(std::shared_ptr<Upstream> u) : u_(std::move(u)) {}
      ~Body() override {
        if (u_) u_->abort();
      }
      void on_start(StreamWriter& w) override { u_->attach_writer(&w); }
      void on_writable(StreamWriter&) override { u_->resume(); }
      void on_abort() override {
        u_->abort();
        u_.reset();
      }

     private:
      std::shared_ptr<Upstream> u_;
    };
    std::string_view type =
        content_type_.empty() ? std::string_view("application/octet-stream") : content_type_;
    auto body = Response::stream(std::make_unique<Body>(shared_from_this()), type, length_);
    body.status = r.status;
    body.headers = std::move(r.headers);
    respond(std::move(body));
  }

  // 101 from the upstream: the client gets the same 101 and both sockets are relayed.
  void on_switch(std::string upstream_leftover);

  void respond(Response r) {
    if (!responder_) return;
    auto* resp = responder_;
    responder_ = nullptr;
    resp->respond(std::move(r));
  }

  void on_body(std::string_view data) {
    if (discard_) return;
    if (writer_) {
      if (!writer_->write(data)) pause_reading();
    } else {
      pending_body_.append(data);  // before on_start: kept, bounded by one read's worth
    }
  }

  void finish_body() {
    auto* w = writer_;
    writer_ = nullptr;
    if (w) w->end();
  }

  void pause_reading() {
    if (conn_ && (conn_->interest & EPOLLIN))
      (void)set_interest(conn_->interest & ~static_cast<uint32_t>(EPOLLIN));
  }

  void fail(int status, std::string_view why, bool retryable = false) {
    close_fd();
    timer_.cancel();
    stall_.cancel();
    if (retryable && !head_seen_ && responder_ && reused_ && !got_bytes_) {
      // A pooled connection the upstream had closed (or the one we were pipelined on failed):
      // the request never got an answer. Again, on a fresh connection (whatever the method).
      reused_ = false;
      pool_ = nullptr;
      got_bytes_ = false;
      llhttp_init(&parser_, HTTP_RESPONSE, &settings_);
      parser_.data = this;
      auto* r = responder_;
      loop_.defer([self = shared_from_this(), r] { self->start(*r); });
      return;
    }
    if (retryable && !head_seen_ && responder_ && retry_hook && retry_hook->retry_before_head()) {
      responder_ = nullptr;  // the next attempt answers
      return;
    }
    // Still behind another request on a pipelined connection: our response will come and is
    // read to nothing.
    discard_ = true;
    if (responder_) {
      auto r = Response::status_only(status);
      r.header("Corral-Proxy-Error", std::string(why));
      respond(std::move(r));
    } else if (writer_) {
      auto* w = writer_;
      writer_ = nullptr;
      w->end();
    }
  }

  // Drops the connection we own (the requests pipelined behind us are sent again elsewhere).
  void close_fd() {
    if (!conn_) return;
    auto c = std::move(conn_);
    if (c->fd && c->interest) loop_.remove(c->fd.get());  // interest: registered
    c->fd.reset();
    c->user = nullptr;
    c->tail = nullptr;
    loop_.destroy_later(std::move(c));  // an event for it may be queued in this batch
    resend_behind();
  }

  int fd() const { return conn_ && conn_->fd ? conn_->fd.get() : -1; }

  bool set_interest(uint32_t want) {
    if (!conn_ || !conn_->fd) return false;
    if (want == conn_->interest) return true;
    conn_->interest = want;
    return static_cast<bool>(loop_.modify(conn_->fd.get(), want, conn_.get()));
  }

  core::EventLoop& loop_;
  UpstreamPool* pool_ = nullptr;
  bool reused_ = false;  // on a connection that was there before us (the pool's, or pipelined)
  std::string request_;  // kept whole for a retry on a fresh connection
  bool upgrade_requested_ = false;
  bool pipelinable_ = false;
  bool switching_ = false;
  std::string path_;
  core::Timer timer_;  // until the response head
  core::Timer stall_;  // while requests are pipelined behind ours and our response has not ended
  uint32_t timeout_ms_ = 0;
  uint64_t sent_ms_ = 0;  // when start() sent (or queued) the request
  bool head_request_;
  std::unique_ptr<UpstreamPool::Conn> conn_;  // while ours: the loop's handler for the socket
  std::shared_ptr<Upstream> next_;            // pipelined behind us
  llhttp_settings_t settings_;
  llhttp_t parser_;
  std::string_view name_;  // of the header being parsed (a view into the read, or name_copy_)
  std::string name_copy_;  // a name split across reads
  bool keep_ = false;      // the header being parsed is passed on
  bool is_type_ = false;   // ... or is Content-Type
  void keep_name() {       // name_ must outlive the read it points into
    if (name_.data() != name_copy_.data()) {
      name_copy_.assign(name_);
      name_ = name_copy_;
    }
  }
  std::vector<std::pair<std::string, std::string>> headers_;  // those passed on (all for a 101)
  std::string content_type_;
  Response pending_head_;  // built, not answered yet (head_waits_)
  bool head_waits_ = false;
  std::optional<uint64_t> length_;  // the body's, from Content-Length
  bool head_seen_ = false;
  bool got_bytes_ = false;  // the upstream sent something (then a retry could repeat its work)
  bool discard_ = false;    // nobody takes our response any more: read it to nothing
 public:
  bool never_sent_ = false;  // connect failed: the request did not leave

 private:
  bool complete_ = false;
  static constexpr uint32_t kMaxInterim = 16;  // 1xx responses read past before the final one
  bool interim_ = false;                       // the response being parsed is a 1xx
  uint32_t interims_ = 0;
  Responder* responder_ = nullptr;
  StreamWriter* writer_ = nullptr;
  std::string pending_body_;
};

// Relays bytes both ways between an upgraded client connection and the upstream, with
// backpressure (a side is not read while the other side's queue is full) and half-closes passed
// on. Owns itself once started; attached to the Server as an Upgraded connection.
class Relay final : public Upgraded {
 public:
  static constexpr size_t kHigh = 256 * 1024;

  Relay(core::EventLoop& loop, Server& server, core::UniqueFd client, tls::SessionPtr client_tls,
        core::UniqueFd upstream)
      : loop_(loop), server_(server) {
    a_.relay = b_.relay = this;
    a_.fd = std::move(client);
    a_.tls = std::move(client_tls);
    b_.fd = std::move(upstream);
    a_.peer = &b_;
    b_.peer = &a_;
  }
  void start(std::string to_upstream, std::string to_client) {
    server_.attach(this);
    b_.out.append(to_upstream);
    a_.out.append(to_client);
    for (Side* s : {&a_, &b_}) {
      s->interest = EPOLLIN;
      if (!loop_.add(s->fd.get(), s->interest, s)) return finish();
    }
    flush(a_);
    flush(b_);
  }
  void server_closing() override {}  // relayed bytes are the upstream's business; close_ms cuts
  void site_replaced(const Site&) override {}
  void force_close() override { finish(); }

 private:
  struct Side final : core::IoHandler {
    Relay* relay = nullptr;
    Side* peer = nullptr;
    core::UniqueFd fd;
    tls::SessionPtr tls;  // the client side over TLS: bytes go through it
    core::Buffer out;     // bytes for this side
    bool eof = false;     // this side sent FIN
    bool shut = false;    // we sent FIN to this side
    uint32_t interest = 0;
    void on_io(uint32_t events) override { relay->on_io(*this, events); }
  };

  void on_io(Side& s, uint32_t events) {
    if (done_) return;
    if (events & EPOLLOUT) flush(s);
    if (done_) return;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      Side& to = *s.peer;
      ssize_t n = s.tls ? s.tls->read(to.out.reserve(16384), 16384)
                        : ::read(s.fd.get(), to.out.reserve(16384), 16384);
      if (n > 0) {
        to.out.commit(static_cast<size_t>(n));
        // What GnuTLS decrypted but did not return is invisible to epoll: take it now.
        while (s.tls && s.tls->pending() > 0) {
          ssize_t more = s.tls->read(to.out.reserve(16384), 16384);
          if (more <= 0) break;
          to.out.commit(static_cast<size_t>(more));
        }
        flush(to);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (n < 0) return finish();
        s.eof = true;
        flush(to);  // passes the FIN on once its queue is out
      }
    }
    update(s);
    update(*s.peer);
    if (a_.eof && b_.eof && a_.out.empty() && b_.out.empty()) finish();
  }

  void flush(Side& s) {
    while (!s.out.empty()) {
      ssize_t n = s.tls ? s.tls->send(s.out.data(), s.out.size())
                        : ::send(s.fd.get(), s.out.data(), s.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        s.out.consume(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      return finish();
    }
    if (s.out.empty() && s.peer->eof && !s.shut) {
      s.shut = true;
      if (s.tls) s.tls->bye();
      ::shutdown(s.fd.get(), SHUT_WR);
    }
    update(s);
  }

  void update(Side& s) {
    if (done_ || !s.fd) return;
    uint32_t want = 0;
    if (!s.eof && s.peer->out.size() < kHigh) want |= EPOLLIN;
    if (!s.out.empty()) want |= EPOLLOUT;
    if (want != s.interest) {
      s.interest = want;
      (void)loop_.modify(s.fd.get(), want, &s);
    }
  }

  void finish() {
    if (done_) return;
    done_ = true;
    for (Side* s : {&a_, &b_}) {
      s->tls.reset();
      if (s->fd) {
        loop_.remove(s->fd.get());
        s->fd.reset();
      }
    }
    server_.detach(this);
    loop_.destroy_later(std::unique_ptr<Relay>(this));
  }

  core::EventLoop& loop_;
  Server& server_;
  Side a_;  // the client
  Side b_;  // the upstream
  bool done_ = false;
};

class RelayUpgrade final : public UpgradeHandler {
 public:
  RelayUpgrade(core::UniqueFd upstream, std::string upstream_leftover)
      : upstream_(std::move(upstream)), leftover_(std::move(upstream_leftover)) {}
  void take_over(UpgradeContext ctx) override {
    auto* relay = new Relay(ctx.loop, ctx.server, std::move(ctx.fd), std::move(ctx.tls),
                            std::move(upstream_));
    // To the client: the 101's unsent bytes, then what the upstream already sent after its 101.
    relay->start(std::move(ctx.leftover_input), ctx.pending_output + leftover_);
  }

 private:
  core::UniqueFd upstream_;
  std::string leftover_;
};

void Upstream::on_switch(std::string upstream_leftover) {
  timer_.cancel();
  head_seen_ = true;
  loop_.remove(fd());
  core::UniqueFd upstream = std::move(conn_->fd);
  close_fd();
  Response r = Response::upgrade(
      std::make_unique<RelayUpgrade>(std::move(upstream), std::move(upstream_leftover)));
  for (auto& [k, v] : headers_) {
    if (iequals(k, "date") || iequals(k, "server") || iequals(k, "content-length")) continue;
    r.headers.emplace_back(std::move(k), std::move(v));
  }
  respond(std::move(r));
}

class ProxyCall final : public DeferredProducer {
 public:
  explicit ProxyCall(std::shared_ptr<Upstream> u) : u_(std::move(u)) {}
  void start(Responder& r) override { u_->start(r); }
  void on_abort() override { u_->abort(); }

 private:
  std::shared_ptr<Upstream> u_;
};

}  // namespace

namespace {

bool is_upgrade(const Request& req) {
  auto up = req.header("upgrade");
  auto conn = req.header("connection");
  if (!up || !conn) return false;
  std::string c(*conn);
  for (auto& ch : c) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
  return c.find("upgrade") != std::string::npos;
}

// A request that may wait behind another on a pipelined upstream connection, and be sent again
// if it was held there: GET or HEAD, no body, no upgrade.
bool pipelinable(const Request& req) {
  return (req.method == Method::kGet || req.method == Method::kHead) && req.body.empty() &&
         !is_upgrade(req);
}

std::string prepare_request(const Request& req, const ProxyOptions& options) {
  std::string r;
  r.reserve(256 + req.target.size() + options.extra_headers.size() + req.body.size());
  std::string_view target = options.target.empty() ? req.target : options.target;
  r.append(req.method_name).append(" ").append(target).append(" HTTP/1.1\r\n");
  // The upstream is on a Unix socket reached only through us: it sees Host: localhost (its own
  // admission baseline admits that) and the client's Host in Corral-Host.
  r.append("Host: localhost\r\n");
  if (!req.host.empty()) r.append("Corral-Host: ").append(req.host).append("\r\n");
  for (const auto& h : req.headers) {
    // Expect: the front has the whole body before the route runs (it answered the client's
    // 100-continue itself, as nginx does), and the body goes with the head: no expectation is
    // left for the upstream to meet.
    if (hop_by_hop(h.name) || corral_header(h.name) || iequals(h.name, "content-length") ||
        iequals(h.name, "host") || iequals(h.name, "expect"))
      continue;
    r.append(h.name).append(": ").append(h.value).append("\r\n");
  }
  r.append(options.extra_headers);
  if (!req.body.empty() || req.method == Method::kPost || req.method == Method::kPut ||
      req.method == Method::kPatch)
    r.append("Content-Length: ").append(std::to_string(req.body.size())).append("\r\n");
  if (is_upgrade(req)) {
    // The one hop-by-hop pair that must cross: the upstream decides whether to switch.
    r.append("Upgrade: ").append(*req.header("upgrade")).append("\r\nConnection: Upgrade\r\n\r\n");
  } else if (!options.pool) {
    r.append("Connection: close\r\n\r\n");
  } else {
    r.append("\r\n");  // HTTP/1.1: keep-alive
  }
  r.append(req.body);
  return r;
}

std::shared_ptr<Upstream> make_upstream(core::EventLoop& loop, std::string path,
                                        std::string request, uint32_t timeout_ms, bool head,
                                        bool upgrade, UpstreamPool* pool = nullptr,
                                        bool pipelinable = false) {
  // Its socket's events go through an UpstreamPool::Conn, which outlives it to the end of the
  // loop's dispatch round (close_fd): the Upstream itself can go at once.
  return std::make_shared<Upstream>(loop, std::move(path), std::move(request), timeout_ms, head,
                                    upgrade, pool, pipelinable);
}

// Finds the upstream, then proxies. The state is shared with the finder's answer, which may come
// after the connection dropped this producer (the client left): then it is ignored.
class FoundCall final : public DeferredProducer {
 public:
  struct State final : RetryHook, std::enable_shared_from_this<State> {
    // An idempotent request, or one that never left (the connect failed), is tried once more.
    bool retry_before_head() override {
      if (aborted || retried) return false;
      if (!idempotent && !(upstream && upstream->never_sent_)) return false;
      retried = true;
      loop->defer([s = shared_from_this()] {
        if (!s->aborted && s->responder) attempt(s);
      });
      return true;
    }
    core::EventLoop* loop;
    std::string request;
    uint32_t timeout_ms;
    bool head;
    bool upgrade = false;
    bool idempotent = false;
    bool pipelinable = false;
    bool retried = false;
    UpstreamPool* pool = nullptr;
    UpstreamFinder find;
    Responder* responder = nullptr;
    std::shared_ptr<Upstream> upstream;
    bool aborted = false;
  };
  FoundCall(std::shared_ptr<State> st) : st_(std::move(st)) {}
  void start(Responder& r) override {
    st_->responder = &r;
    attempt(st_);
  }
  void on_abort() override {
    st_->aborted = true;
    st_->responder = nullptr;
    if (st_->upstream) st_->upstream->abort();
  }

 private:
  // Finds the upstream and sends the request. An idempotent request whose upstream went away
  // before answering anything (a worker stopping as the request arrived) is tried once more:
  // the finder then starts a new worker.
  static void attempt(const std::shared_ptr<State>& state) {
    state->find(
        [st = state](std::string path, std::optional<Response> instead) {
          if (st->aborted || !st->responder) return;
          if (instead) {
            auto* resp = st->responder;
            st->responder = nullptr;
            resp->respond(std::move(*instead));
            return;
          }
          st->upstream = make_upstream(*st->loop, std::move(path), st->request, st->timeout_ms,
                                       st->head, st->upgrade, st->pool, st->pipelinable);
          st->upstream->retry_hook = st.get();  // not owning: the upstream may outlive it
          st->upstream->start(*st->responder);
        },
        state->retried);
  }

  std::shared_ptr<State> st_;
};

}  // namespace

Response proxy_to(Request& req, std::string unix_path, ProxyOptions options) {
  if (!req.loop) return Response::status_only(502);
  if (options.pool) ++options.pool->stats().requests;
  auto upstream = make_upstream(*req.loop, std::move(unix_path), prepare_request(req, options),
                                options.response_timeout_ms, req.method == Method::kHead,
                                is_upgrade(req), options.pool, pipelinable(req));
  return Response::deferred(std::make_unique<ProxyCall>(std::move(upstream)));
}

Response proxy_found(Request& req, UpstreamFinder find, ProxyOptions options) {
  if (!req.loop) return Response::status_only(502);
  if (options.pool) ++options.pool->stats().requests;
  auto st = std::make_shared<FoundCall::State>();
  st->loop = req.loop;
  st->request = prepare_request(req, options);
  st->timeout_ms = options.response_timeout_ms;
  st->head = req.method == Method::kHead;
  st->upgrade = is_upgrade(req);
  st->idempotent =
      req.method == Method::kGet || req.method == Method::kHead || req.method == Method::kOptions;
  st->find = std::move(find);
  st->pool = options.pool;
  st->pipelinable = pipelinable(req);
  return Response::deferred(std::make_unique<FoundCall>(std::move(st)));
}

}  // namespace corral::http
