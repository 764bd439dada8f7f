#include "cluster/etcd_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/unique_fd.h"
#include "proxy/response_reader.h"

namespace corral::cluster {
namespace {

constexpr size_t kReadChunk = 16 * 1024;
// A failed call's body, kept for its error message; more is not read into memory.
constexpr size_t kMaxErrorBody = 64 * 1024;

core::Result<core::UniqueFd> connect_tcp(const core::SocketAddress& a) {
  int raw = ::socket(a.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (raw < 0) return core::errno_error("socket");
  core::UniqueFd fd(raw);
  int one = 1;
  ::setsockopt(raw, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A watch can be quiet for hours: TCP keep-alive notices a member that vanished without a
  // FIN or RST (a host powered off) in about 5 + 3 * 2 = 11 s.
  int idle = 5, interval = 2, count = 3;
  ::setsockopt(raw, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(raw, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(raw, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(raw, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  if (::connect(raw, reinterpret_cast<const sockaddr*>(&a.storage), a.len) < 0 &&
      errno != EINPROGRESS)
    return core::errno_error("connect to etcd");
  return fd;
}

int socket_error(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return errno;
  return err;
}

core::Error io_error(int err, const char* what) {
  return core::Error{err, std::string(what) + ": " + std::strerror(err)};
}

// One write of what is left of `out`; false on an error (`err` set).
bool write_some(int fd, const std::string& out, size_t& written, int& err) {
  while (written < out.size()) {
    ssize_t n = ::send(fd, out.data() + written, out.size() - written, MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    err = n < 0 ? errno : EPIPE;
    return false;
  }
  return true;
}

}  // namespace

std::string http_request(std::string_view method, std::string_view path, std::string_view host,
                         std::string_view body) {
  std::string out;
  out.reserve(128 + body.size());
  out.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ").append(host);
  if (method == "GET") {
    out.append("\r\n\r\n");
    return out;
  }
  out.append("\r\nContent-Type: application/json\r\nContent-Length: ")
      .append(std::to_string(body.size()))
      .append("\r\n\r\n")
      .append(body);
  return out;
}

core::Result<std::pair<core::SocketAddress, std::string>> parse_endpoint(std::string_view text) {
  std::string_view rest = text;
  auto bad = [text](std::string why) {
    return core::Error{EINVAL, "etcd endpoint '" + std::string(text) + "': " + std::move(why)};
  };
  if (rest.starts_with("https://")) return bad("TLS to etcd is not supported yet");
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  while (rest.ends_with("/")) rest.remove_suffix(1);
  if (rest.empty() || rest.find('/') != std::string_view::npos)
    return bad("expected http://IP:port");
  auto addr = core::parse_address(rest);
  if (!addr) return bad(addr.error().reason);
  return std::pair{*addr, std::string(rest)};
}

// ---- unary calls ------------------------------------------------------------------------------

struct Client::Call {
  std::string method;
  std::string path;
  std::string body;
  std::function<void(core::Result<std::string>)> done;  // null once cancelled
  const void* owner = nullptr;
  size_t tries = 0;  // connections it was sent on (or tried to be)
  Connection* conn = nullptr;
  core::Timer timer;  // the call's deadline
};

// One keep-alive connection to an endpoint, carrying one call at a time.
class Client::Connection final : public core::IoHandler, private proxy::ResponseReader::Events {
 public:
  Connection(Client& client, size_t endpoint, core::UniqueFd fd)
      : client_(client), endpoint_(endpoint), fd_(std::move(fd)) {
    connect_timer_.bind(client_.loop_.timers(), [this] {
      fail(core::Error{ETIMEDOUT, "connect to etcd: timed out"}, true);
    });
  }
  ~Connection() { close(); }

  core::Result<void> start() {
    connect_timer_.arm_after(client_.options_.connect_timeout_ms);
    return client_.loop_.add(fd_.get(), EPOLLIN | EPOLLOUT, this);
  }
  bool idle() const { return !call_ && !closed_; }
  size_t endpoint() const { return endpoint_; }

  void send(std::unique_ptr<Call> call) {
    call->conn = this;
    out_ = http_request(call->method, call->path, client_.endpoints_[endpoint_].host, call->body);
    written_ = 0;
    status_ = 0;
    body_.clear();
    got_bytes_ = false;
    reader_.start(*this, false, false);
    call_ = std::move(call);
    if (connected_) {
      write();
    } else {
      (void)client_.loop_.modify(fd_.get(), EPOLLIN | EPOLLOUT, this);
    }
  }

  // Ends the connection: its call goes back to the client, retried if `retryable`.
  void fail(core::Error why, bool retryable, bool endpoint_fault = true) {
    if (closed_) return;
    close();
    client_.connection_done(this, std::move(why), retryable, endpoint_fault);
  }
  std::unique_ptr<Call> take_call() {
    if (call_) call_->conn = nullptr;
    return std::move(call_);
  }

  void on_io(uint32_t events) override {
    if (closed_) return;
    if (!connected_) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      if (int err = socket_error(fd_.get()); err != 0)
        return fail(io_error(err, "connect to etcd"), true);
      connected_ = true;
      connect_timer_.cancel();
      if (!call_) return (void)client_.loop_.modify(fd_.get(), EPOLLIN, this);
    }
    if (call_ && written_ < out_.size()) {
      write();
      if (closed_) return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read();
  }

 private:
  void write() {
    int err = 0;
    if (!write_some(fd_.get(), out_, written_, err)) {
      // Nothing of the request may have arrived only if nothing left; a reused connection the
      // server closed while idle fails here too.
      return fail(io_error(err, "send to etcd"), written_ == 0 || (reused_ && !got_bytes_));
    }
    (void)client_.loop_.modify(fd_.get(), written_ < out_.size() ? EPOLLIN | EPOLLOUT : EPOLLIN,
                               this);
  }

  void read() {
    char buf[kReadChunk];
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0) return fail(io_error(errno, "read from etcd"), reused_ && !got_bytes_);
    if (n == 0 && !call_)
      return fail(core::Error{ECONNRESET, "idle connection closed"}, false, false);
    if (n == 0) {
      if (call_ && reader_.finish() == proxy::ResponseReader::State::kComplete) return done(false);
      return fail(core::Error{ECONNRESET, "etcd closed the connection"}, reused_ && !got_bytes_);
    }
    if (!call_) return fail(core::Error{EPROTO, "etcd sent bytes nobody asked for"}, false);
    got_bytes_ = true;
    auto fed = reader_.feed(buf, static_cast<size_t>(n));
    switch (fed.state) {
      case proxy::ResponseReader::State::kMore:
        return;
      case proxy::ResponseReader::State::kComplete:
        // Bytes after the answer are nobody's: the connection cannot be reused.
        return done(reader_.keep_alive() && fed.used == static_cast<size_t>(n));
      default:
        return fail(core::Error{EPROTO, "malformed HTTP response from etcd"}, false);
    }
  }

  void done(bool keep_alive) {
    core::Result<std::string> result =
        status_ == 200 ? core::Result<std::string>(std::move(body_))
                       : core::Result<std::string>(decode_error(status_, body_));
    reused_ = true;
    if (!keep_alive) close();
    client_.connection_done(this, std::move(result), false, false);
  }

  void on_head(proxy::ResponseHead& head) override { status_ = head.status; }
  void on_body(std::string_view data) override {
    if (status_ != 200 && body_.size() + data.size() > kMaxErrorBody) return;
    body_.append(data);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    connect_timer_.cancel();
    client_.loop_.remove(fd_.get());
    fd_.reset();
  }

  Client& client_;
  size_t endpoint_;
  core::UniqueFd fd_;
  core::Timer connect_timer_;
  std::unique_ptr<Call> call_;
  std::string out_;
  size_t written_ = 0;
  proxy::ResponseReader reader_;
  int status_ = 0;
  std::string body_;
  bool connected_ = false;
  bool closed_ = false;
  bool reused_ = false;     // a call was answered on it before this one
  bool got_bytes_ = false;  // the current call got bytes back

  friend class Client;
};

core::Result<std::unique_ptr<Client>> Client::create(core::EventLoop& loop, ClientOptions options) {
  if (options.endpoints.empty()) return core::Error{EINVAL, "no etcd endpoint"};
  std::vector<Endpoint> endpoints;
  for (const auto& e : options.endpoints) {
    auto parsed = parse_endpoint(e);
    if (!parsed) return parsed.error();
    endpoints.push_back({parsed->first, std::move(parsed->second)});
  }
  if (options.max_connections == 0) options.max_connections = 1;
  return std::unique_ptr<Client>(new Client(loop, std::move(options), std::move(endpoints)));
}

Client::Client(core::EventLoop& loop, ClientOptions options, std::vector<Endpoint> endpoints)
    : loop_(loop), options_(std::move(options)), endpoints_(std::move(endpoints)) {}

Client::~Client() {
  *alive_ = false;
  for (auto& c : connections_) c->close();
}

void Client::call(std::string method, std::string_view path, std::string body,
                  std::function<void(core::Result<std::string>)> done, const void* owner) {
  auto call = std::make_unique<Call>();
  call->method = std::move(method);
  call->path = std::string(path);
  call->body = std::move(body);
  call->done = std::move(done);
  call->owner = owner;
  Call* raw = call.get();
  call->timer.bind(loop_.timers(), [this, raw] { timed_out(raw); });
  call->timer.arm_after(options_.request_timeout_ms);
  queue_.push_back(std::move(call));
  schedule_dispatch();
}

void Client::schedule_dispatch() {
  if (dispatch_scheduled_) return;
  dispatch_scheduled_ = true;
  loop_.defer([this, alive = alive_] {
    if (*alive) dispatch();
  });
}

void Client::dispatch() {
  dispatch_scheduled_ = false;
  while (!queue_.empty()) {
    Connection* conn = nullptr;
    for (auto& c : connections_) {
      if (c->idle() && c->endpoint() == current_) {
        conn = c.get();
        break;
      }
    }
    if (!conn) {
      // Idle connections to an endpoint the client left make room for the current one.
      for (auto& c : connections_) {
        if (c->idle() && c->endpoint() != current_) {
          c->close();
          loop_.destroy_later(std::move(c));
        }
      }
      std::erase(connections_, nullptr);
      if (connections_.size() >= options_.max_connections) return;
      auto fd = connect_tcp(endpoints_[current_].address);
      core::Result<void> added = fd ? core::Result<void>() : core::Result<void>(fd.error());
      std::unique_ptr<Connection> fresh;
      if (fd) {
        fresh = std::make_unique<Connection>(*this, current_, std::move(*fd));
        added = fresh->start();
      }
      if (!added) {
        auto call = std::move(queue_.front());
        queue_.pop_front();
        ++call->tries;
        endpoint_failed(current_);
        if (call->tries < endpoints_.size() + 1) {
          queue_.push_front(std::move(call));
        } else {
          complete(std::move(call), added.error());
        }
        continue;
      }
      conn = fresh.get();
      connections_.push_back(std::move(fresh));
    }
    auto call = std::move(queue_.front());
    queue_.pop_front();
    ++call->tries;
    conn->send(std::move(call));
  }
}

void Client::complete(std::unique_ptr<Call> call, core::Result<std::string> result) {
  call->timer.cancel();
  if (!call->done) return;
  auto done = std::move(call->done);
  done(std::move(result));
}

void Client::timed_out(Call* call) {
  if (call->conn) {
    call->conn->fail(core::Error{ETIMEDOUT, "etcd did not answer in time"}, false);
    return;
  }
  auto it =
      std::find_if(queue_.begin(), queue_.end(), [call](const auto& c) { return c.get() == call; });
  if (it == queue_.end()) return;
  auto owned = std::move(*it);
  queue_.erase(it);
  complete(std::move(owned), core::Error{ETIMEDOUT, "no connection to etcd in time"});
}

void Client::connection_done(Connection* conn, core::Result<std::string> result, bool retryable,
                             bool endpoint_fault) {
  auto call = conn->take_call();
  if (endpoint_fault) endpoint_failed(conn->endpoint());
  if (conn->closed_) {
    auto it = std::find_if(connections_.begin(), connections_.end(),
                           [conn](const auto& c) { return c.get() == conn; });
    if (it != connections_.end()) {
      loop_.destroy_later(std::move(*it));
      connections_.erase(it);
    }
  } else {
    (void)loop_.modify(conn->fd_.get(), EPOLLIN, conn);
  }
  if (!queue_.empty()) schedule_dispatch();
  if (!call) return;
  if (!result.ok() && retryable && call->tries < endpoints_.size() + 1) {
    queue_.push_front(std::move(call));
    schedule_dispatch();
    return;
  }
  complete(std::move(call), std::move(result));
}

void Client::endpoint_failed(size_t index) {
  if (index == current_) current_ = (current_ + 1) % endpoints_.size();
}

void Client::cancel(const void* owner) {
  if (!owner) return;
  std::erase_if(queue_, [owner](const auto& c) { return c->owner == owner; });
  for (auto& c : connections_) {
    if (c->call_ && c->call_->owner == owner) {
      c->call_->done = nullptr;
      c->call_->owner = nullptr;
    }
  }
}

void Client::range(const RangeRequest& r, Done<RangeResponse> done, const void* owner) {
  call(
      "POST", kRangePath, encode(r),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_range(*body));
      },
      owner);
}

void Client::put(const PutRequest& r, Done<PutResponse> done, const void* owner) {
  call(
      "POST", kPutPath, encode(r),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_put(*body));
      },
      owner);
}

void Client::delete_range(const DeleteRangeRequest& r, Done<DeleteRangeResponse> done,
                          const void* owner) {
  call(
      "POST", kDeleteRangePath, encode(r),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_delete_range(*body));
      },
      owner);
}

void Client::txn(const TxnRequest& r, Done<TxnResponse> done, const void* owner) {
  call(
      "POST", kTxnPath, encode(r),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_txn(*body));
      },
      owner);
}

void Client::lease_grant(int64_t ttl_s, Done<LeaseGrantResponse> done, const void* owner) {
  call(
      "POST", kLeaseGrantPath, encode_lease_grant(ttl_s),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_lease_grant(*body));
      },
      owner);
}

void Client::lease_keepalive(int64_t id, Done<LeaseKeepAliveResponse> done, const void* owner) {
  call(
      "POST", kLeaseKeepAlivePath, encode_lease_keepalive(id),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        LineSplitter lines;
        lines.feed(*body);
        lines.feed("\n");  // the last line may come without its newline
        auto line = lines.next_line();
        if (!line) return done(core::Error{kMalformed, "empty etcd keep-alive answer"});
        done(decode_lease_keepalive(*line));
      },
      owner);
}

void Client::lease_revoke(int64_t id, Done<LeaseRevokeResponse> done, const void* owner) {
  call(
      "POST", kLeaseRevokePath, encode_lease_revoke(id),
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(decode_lease_revoke(*body));
      },
      owner);
}

void Client::health(Done<bool> done, const void* owner) {
  call(
      "GET", "/health", {},
      [done = std::move(done)](core::Result<std::string> body) {
        if (!body) return done(body.error());
        done(body->find("\"health\":\"true\"") != std::string::npos);
      },
      owner);
}

// ---- watches ----------------------------------------------------------------------------------

// The connection of one watch: a POST whose answer never ends.
class Watch::Stream final : public core::IoHandler, private proxy::ResponseReader::Events {
 public:
  Stream(Watch& watch, size_t endpoint, core::UniqueFd fd)
      : watch_(watch), endpoint_(endpoint), fd_(std::move(fd)) {}
  ~Stream() { close(); }

  core::Result<void> start(std::string request) {
    out_ = std::move(request);
    reader_.start(*this, false, false);
    return watch_.loop().add(fd_.get(), EPOLLIN | EPOLLOUT, this);
  }
  void close() {
    if (!fd_) return;
    watch_.loop().remove(fd_.get());
    fd_.reset();
  }
  size_t endpoint() const { return endpoint_; }
  LineSplitter& lines() { return lines_; }

  void on_io(uint32_t events) override {
    if (!fd_) return;
    if (!connected_) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      if (int err = socket_error(fd_.get()); err != 0)
        return watch_.broken(io_error(err, "watch: connect to etcd"), true);
      connected_ = true;
    }
    if (written_ < out_.size()) {
      int err = 0;
      if (!write_some(fd_.get(), out_, written_, err))
        return watch_.broken(io_error(err, "watch: send to etcd"), true);
      if (written_ == out_.size()) (void)watch_.loop().modify(fd_.get(), EPOLLIN, this);
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    char buf[kReadChunk];
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0) return watch_.broken(io_error(errno, "watch: read from etcd"), true);
    if (n == 0) return watch_.broken(core::Error{ECONNRESET, "watch: etcd closed it"}, true);
    auto fed = reader_.feed(buf, static_cast<size_t>(n));
    if (fed.state == proxy::ResponseReader::State::kError || broken_)
      return watch_.broken(core::Error{EPROTO, "watch: malformed answer from etcd"}, true);
    if (status_ != 0 && status_ != 200) {
      if (fed.state == proxy::ResponseReader::State::kMore) return;  // the rest of its error
      return watch_.broken(decode_error(status_, error_body_), false);
    }
    watch_.deliver();
    // A watch's answer never ends while etcd serves it.
    if (fed.state != proxy::ResponseReader::State::kMore && fd_)
      watch_.broken(core::Error{ECONNRESET, "watch: etcd ended the stream"}, true);
  }

 private:
  void on_head(proxy::ResponseHead& head) override { status_ = head.status; }
  void on_body(std::string_view data) override {
    if (status_ != 200) {
      if (error_body_.size() + data.size() <= kMaxErrorBody) error_body_.append(data);
      return;
    }
    if (!lines_.feed(data)) broken_ = true;
  }

  Watch& watch_;
  size_t endpoint_;
  core::UniqueFd fd_;
  std::string out_;
  size_t written_ = 0;
  bool connected_ = false;
  bool broken_ = false;  // a line too long
  proxy::ResponseReader reader_;
  int status_ = 0;
  std::string error_body_;
  LineSplitter lines_;
};

std::unique_ptr<Watch> Client::watch(WatchRequest request, WatchHandler& handler) {
  return std::unique_ptr<Watch>(new Watch(*this, std::move(request), handler));
}

Watch::Watch(Client& client, WatchRequest request, WatchHandler& handler)
    : client_(client),
      request_(std::move(request)),
      handler_(handler),
      next_revision_(request_.start_revision) {
  retry_.bind(client_.loop_.timers(), [this] { connect(); });
  // Connecting from the loop: the handler hears of a failure after watch() returned.
  retry_.arm_after(0);
}

core::EventLoop& Watch::loop() {
  return client_.loop_;
}

Watch::~Watch() {
  if (dead_) *dead_ = true;
  if (stream_) {
    // This may run inside the stream's own callback (a handler that drops its watch).
    stream_->close();
    loop().destroy_later(std::move(stream_));
  }
}

void Watch::connect() {
  size_t endpoint = client_.current_;
  auto fd = connect_tcp(client_.endpoints_[endpoint].address);
  if (!fd) return broken(fd.error(), true);
  stream_ = std::make_unique<Stream>(*this, endpoint, std::move(*fd));
  WatchRequest req = request_;
  req.start_revision = next_revision_;
  auto started = stream_->start(
      http_request("POST", kWatchPath, client_.endpoints_[endpoint].host, encode(req)));
  if (!started) return broken(started.error(), true);
  // Until etcd says "created" the stream is not trusted to be alive; after it, a quiet stream is
  // normal (TCP keep-alive watches the peer).
  retry_.bind(client_.loop_.timers(), [this] {
    broken(core::Error{ETIMEDOUT, "watch: etcd did not create it in time"}, true);
  });
  retry_.arm_after(client_.options_.connect_timeout_ms + client_.options_.request_timeout_ms);
}

void Watch::broken(core::Error why, bool endpoint_fault) {
  created_ = false;
  if (stream_) {
    if (endpoint_fault) client_.endpoint_failed(stream_->endpoint());
    stream_->close();
    client_.loop_.destroy_later(std::move(stream_));
  }
  backoff_ms_ = backoff_ms_ == 0 ? client_.options_.watch_backoff_first_ms
                                 : std::min(backoff_ms_ * 2, client_.options_.watch_backoff_max_ms);
  retry_.bind(client_.loop_.timers(), [this] { connect(); });
  retry_.arm_after(backoff_ms_);
  bool dead = false;
  dead_ = &dead;
  handler_.on_watch_broken(why);
  if (dead) return;
  dead_ = nullptr;
}

void Watch::deliver() {
  while (stream_) {
    auto line = stream_->lines().next_line();
    if (!line) return;
    auto r = decode_watch(*line);
    if (!r) return broken(r.error(), false);
    if (r->compact_revision > 0) {
      // etcd cancelled the watch: what it would resume from is gone. Resume from what is left,
      // at once, and let the handler read the state again.
      next_revision_ = r->compact_revision;
      stream_->close();
      client_.loop_.destroy_later(std::move(stream_));
      created_ = false;
      retry_.bind(client_.loop_.timers(), [this] { connect(); });
      retry_.arm_after(0);
      bool dead = false;
      dead_ = &dead;
      handler_.on_compacted(r->compact_revision);
      if (dead) return;
      dead_ = nullptr;
      return;
    }
    if (r->canceled)
      return broken(core::Error{kEtcdError, "watch cancelled by etcd: " + r->cancel_reason}, false);
    if (r->created) {
      created_ = true;
      backoff_ms_ = 0;
      retry_.cancel();
      if (next_revision_ == 0) next_revision_ = r->header.revision + 1;
    }
    for (const auto& ev : r->events)
      next_revision_ = std::max(next_revision_, ev.kv.mod_revision + 1);
    if (!r->created && r->events.empty())  // a progress notification
      next_revision_ = std::max(next_revision_, r->header.revision + 1);
    bool dead = false;
    dead_ = &dead;
    handler_.on_watch(*r);
    if (dead) return;
    dead_ = nullptr;
  }
}

}  // namespace corral::cluster
