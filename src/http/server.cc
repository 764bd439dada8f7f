#include "http/server.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "http/connection.h"
#include "http/metrics.h"

namespace corral::http {

namespace {
constexpr int kAcceptBatch = 64;  // per wakeup, so one busy listener cannot starve connections
constexpr char kBusyResponse[] =
    "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
}  // namespace

class Server::Listener final : public core::IoHandler {
 public:
  Listener(Server& server, core::UniqueFd fd,
           std::shared_ptr<const core::TransportFactory> transport)
      : server_(server), fd_(std::move(fd)), transport_(std::move(transport)) {}
  // After close() the listener may still have an event queued in this epoll batch: ignore it, so
  // a connection in the shared accept queue is left to another process instead of refused.
  void on_io(uint32_t) override {
    if (!server_.closing()) server_.on_accept(fd_.get(), transport_.get());
  }
  int fd() const { return fd_.get(); }

 private:
  Server& server_;
  core::UniqueFd fd_;
  // shared: one reload generation's TLS factory serves every TLS listener of a process. Null:
  // plain TCP.
  std::shared_ptr<const core::TransportFactory> transport_;
};

Server::Server(core::EventLoop& loop, core::Logger& log, ServerOptions options)
    : loop_(loop),
      log_(log),
      options_(std::move(options)),
      policy_(std::make_shared<AdmissionPolicy>()),
      close_timer_(loop.timers(),
                   [this] {
                     log_.info("close_timeout", "connections={}", stats_.active);
                     while (head_) head_->close_now();
                     if (!draining_)
                       while (upgraded_) upgraded_->force_close();
                   }),
      drain_timer_(loop.timers(),
                   [this] {
                     log_.info("drain_timeout", "upgraded={}", stats_.active);
                     close_upgraded();
                   }),
      accept_pause_(loop.timers(), [this] { resume_accepting(); }) {}

Server::~Server() {
  while (head_) head_->close_now();
  while (upgraded_) upgraded_->force_close();
  loop_.defer([] {});  // destroyed connections are freed by the loop's graveyard
}

core::Result<core::SocketAddress> Server::listen(
    const core::SocketAddress& addr, bool reuse_port,
    std::shared_ptr<const core::TransportFactory> transport) {
  auto fd = core::listen_tcp(addr, {.backlog = 4096, .reuse_port = reuse_port});
  if (!fd) return fd.error();
  auto local = core::local_address(fd->get());
  if (!local) return local.error();
  if (auto r = adopt_listener(std::move(fd.value()), std::move(transport)); !r) return r.error();
  return local;
}

core::Result<void> Server::adopt_listener(core::UniqueFd fd,
                                          std::shared_ptr<const core::TransportFactory> transport) {
  auto l = std::make_unique<Listener>(*this, std::move(fd), std::move(transport));
  if (auto r = loop_.add(l->fd(), EPOLLIN, l.get()); !r) return r;
  listeners_.push_back(std::move(l));
  return {};
}

void Server::publish(std::shared_ptr<const Site> site) {
  site_ = std::move(site);
  auto waiting = std::move(parked_);
  parked_.clear();
  for (Connection* c : waiting) c->site_ready();
  for (Upgraded* u = upgraded_; u;) {
    Upgraded* next = u->next_;
    u->site_replaced(*site_);
    u = next;
  }
}

void Server::attach(Upgraded* u) {
  u->prev_ = nullptr;
  u->next_ = upgraded_;
  if (upgraded_) upgraded_->prev_ = u;
  upgraded_ = u;
  ++upgraded_count_;
  ++stats_.active;
  add(metrics().websockets);
  add(metrics().gauges.websockets_open, 1);
  notify_idle();
  if (closing_ && !draining_) u->server_closing();  // draining: a fresh socket is kept too
}

void Server::detach(Upgraded* u) {
  if (u->prev_) u->prev_->next_ = u->next_;
  if (u->next_) u->next_->prev_ = u->prev_;
  if (upgraded_ == u) upgraded_ = u->next_;
  u->prev_ = u->next_ = nullptr;
  --upgraded_count_;
  --stats_.active;
  add(metrics().gauges.websockets_open, -1);
  notify_idle();
  if (closing_) maybe_finish_close();
}

void Server::request_started() {
  ++inflight_;
  notify_idle();
}

void Server::request_finished() {
  --inflight_;
  notify_idle();
}

void Server::notify_idle() {
  bool now_idle = idle();
  if (now_idle == was_idle_) return;
  was_idle_ = now_idle;
  if (on_idle_change) on_idle_change(now_idle);
}

void Server::unpark(Connection* c) {
  std::erase(parked_, c);
}

void Server::set_policy(std::shared_ptr<const AdmissionPolicy> policy) {
  policy_ = std::move(policy);
  for (Connection* c = head_; c;) {
    Connection* next = c->next_;
    c->policy_changed();
    c = next;
  }
}

std::string_view Server::date() {
  return date_.get(loop_.wall_seconds());
}

std::string_view Server::log_time() {
  if (loop_.wall_seconds() != log_time_s_) {
    log_time_s_ = loop_.wall_seconds();
    core::format_iso8601(log_time_s_, log_time_);
  }
  return log_time_;
}

void Server::assign_trace(Request& req) {
  std::optional<std::string_view> sent;
  for (const auto& h : req.headers) {
    if (h.name.size() != 11 || !iequals(h.name, "traceparent")) continue;
    if (sent) {  // two: neither is the trace
      sent.reset();
      break;
    }
    sent = h.value;
  }
  if (sent && valid_traceparent(*sent)) {
    req.set_traceparent(*sent);
    return;
  }
  char made[kTraceparentSize];
  trace_ids_.make(made);
  req.set_traceparent({made, sizeof made});
}

void Server::on_accept(int listen_fd, const core::TransportFactory* transport) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    core::SocketAddress peer;
    peer.len = sizeof peer.storage;
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer.storage), &peer.len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop accepting for a moment instead of spinning on the listener.
        log_.error("accept_failed", "error=\"{}\" pause_ms=100", strerror(errno));
        for (auto& l : listeners_) loop_.remove(l->fd());
        accept_pause_.arm_after(100);
        return;
      }
      log_.error("accept_failed", "error=\"{}\"", strerror(errno));
      return;
    }
    ++stats_.accepted;
    if (options_.admit_socket && !options_.admit_socket(fd)) {
      ::close(fd);
      continue;
    }
    if (stats_.active >= options_.max_connections || closing_) {
      // Refuse without touching the connections already served: a canned answer, then close.
      ++stats_.refused;
      add(metrics().connections_refused);
      // (A client of a wrapping transport, TLS, could not read plain text: it is only closed.)
      [[maybe_unused]] ssize_t w =
          transport ? 0 : ::send(fd, kBusyResponse, sizeof kBusyResponse - 1, MSG_NOSIGNAL);
      ::close(fd);
      if (stats_.refused % 1000 == 1)
        log_.warn("connection_refused", "reason=max_connections limit={} refused_total={}",
                  options_.max_connections, stats_.refused);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::unique_ptr<core::Transport> t;
    if (transport) {
      auto w = transport->wrap(core::UniqueFd(fd));  // closes the socket if it fails
      if (!w) {
        log_.error("tls_session_failed", "error=\"{}\"", w.error().reason);
        continue;
      }
      t = std::move(w.value());
    } else {
      t = std::make_unique<core::PlainTransport>(core::UniqueFd(fd));
    }
    auto* c = new Connection(*this, std::move(t), peer);
    c->next_ = head_;
    if (head_) head_->prev_ = c;
    head_ = c;
    ++stats_.active;
    add(metrics().proto[ProcessMetrics::kHttp1].connections);
    add(metrics().gauges.connections_open[ProcessMetrics::kHttp1], 1);
    c->start();
  }
}

void Server::resume_accepting() {
  for (auto& l : listeners_) (void)loop_.add(l->fd(), EPOLLIN, l.get());
}

void Server::connection_closed(Connection* c) {
  if (c->prev_) c->prev_->next_ = c->next_;
  if (c->next_) c->next_->prev_ = c->prev_;
  if (head_ == c) head_ = c->next_;
  c->prev_ = c->next_ = nullptr;
  unpark(c);
  --stats_.active;
  add(metrics().gauges.connections_open[ProcessMetrics::kHttp1], -1);
  loop_.destroy_later(std::unique_ptr<Connection>(c));
  if (closing_) maybe_finish_close();
}

void Server::close(std::function<void()> done) {
  if (draining_) {
    close_upgraded();  // SIGTERM during a drain: the WebSockets get their 1001 now
    return;
  }
  if (closing_) return;
  stop_accepting(std::move(done));
  close_upgraded_now();
}

void Server::drain(std::function<void()> done) {
  if (closing_) return;
  if (options_.drain_timeout_ms == 0) return close(std::move(done));
  draining_ = true;
  stop_accepting(std::move(done));
  size_t upgraded = 0;
  for (Upgraded* u = upgraded_; u; u = u->next_) ++upgraded;
  log_.info("draining", "connections={} upgraded={} drain_ms={}", stats_.active - upgraded,
            upgraded, options_.drain_timeout_ms);
  if (head_) close_timer_.arm_after(options_.close_timeout_ms);
  drain_timer_.arm_after(options_.drain_timeout_ms);
  maybe_finish_close();
}

void Server::close_upgraded() {
  if (!draining_) return;
  draining_ = false;
  drain_timer_.cancel();
  close_upgraded_now();
}

void Server::close_upgraded_now() {
  for (Upgraded* u = upgraded_; u;) {
    Upgraded* next = u->next_;
    u->server_closing();
    u = next;
  }
  // What does not finish its close handshake (and HTTP connections still running) is cut then.
  if (head_ || upgraded_) close_timer_.arm_after(options_.close_timeout_ms);
  maybe_finish_close();
}

void Server::stop_accepting(std::function<void()> done) {
  closing_ = true;
  close_done_ = std::move(done);
  accept_pause_.cancel();
  for (auto& l : listeners_) {
    loop_.remove(l->fd());
    loop_.destroy_later(std::move(l));  // an event for it may be queued in this batch
  }
  listeners_.clear();
  for (Connection* c = head_; c;) {
    Connection* next = c->next_;
    c->begin_close();
    c = next;
  }
}

void Server::maybe_finish_close() {
  if (!closing_ || head_ || upgraded_ || !close_done_) return;
  close_timer_.cancel();
  drain_timer_.cancel();
  draining_ = false;
  log_.flush();
  auto done = std::move(close_done_);
  close_done_ = nullptr;
  loop_.defer(std::move(done));
}

}  // namespace corral::http
