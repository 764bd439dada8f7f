#include "ws/socket.h"

#include <algorithm>

#include "core/buffer.h"
#include "core/event_loop.h"
#include "core/transport.h"
#include "http/server.h"

namespace corral::ws {

std::string_view Socket::param(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return p.value;
  return {};
}

namespace {

constexpr size_t kReadSize = 16 * 1024;
constexpr uint32_t kLingerMs = 1000;
// Pings left unanswered (coalesced) because the pong before them is still stuck in our output: a
// peer that sends this many while it reads nothing floods (a client library pings every few
// seconds; a flood sends ~130 per 16 KiB read). Its connection is dropped with 1008.
constexpr size_t kMaxCoalescedPings = 1024;

// One upgraded connection: the Socket the application sees, the frame codec, the loop's handler,
// and the Server's record of it (graceful close, site swaps).
class Connection final : public Socket,
                         public core::IoHandler,
                         public http::Upgraded,
                         private FrameHandler {
 public:
  Connection(http::UpgradeContext ctx, std::shared_ptr<const SocketRoute> route,
             const SocketLimits& limits, const std::optional<DeflateParams>& deflate)
      : loop_(ctx.loop),
        server_(ctx.server),
        transport_(std::move(ctx.transport)),
        route_(std::move(route)),
        limits_(limits),
        decoder_(decoder_limits(limits.max_message, deflate)),
        encoder_(deflate ? FrameEncoder(*deflate) : FrameEncoder()),
        timer_(loop_.timers(), [this] { on_timer(); }) {
    remote_address_ = std::move(ctx.peer);
    in_.append(ctx.leftover_input);
    out_.append(ctx.pending_output);
  }

  void start() {
    server_.attach(this);
    attached_ = true;
    last_rx_ = loop_.now();
    if (auto r = loop_.add(transport_->fd(), EPOLLIN | EPOLLRDHUP, this); !r) {
      abort("epoll_add failed");
      return;
    }
    interest_ = EPOLLIN | EPOLLRDHUP;
    timer_.arm_after(limits_.ping_interval_ms);
    if (route_->on_open) route_->on_open(*this);
    if (!in_.empty() && state_ != State::kDone) decode();
    flush();
  }

  // Socket
  bool send_text(std::string_view text) override { return send(Opcode::kText, text); }
  bool send_binary(std::string_view data) override { return send(Opcode::kBinary, data); }
  void close(uint16_t code, std::string_view reason) override {
    if (state_ != State::kOpen) return;
    if (!valid_close_code(code)) code = kCloseNormal;
    start_close(code, reason, code);
  }
  size_t buffered_amount() const override { return out_.size(); }
  bool is_open() const override { return state_ == State::kOpen; }

  // http::Upgraded
  void server_closing() override { close_from_server(kCloseGoingAway, "server closing"); }
  void site_replaced(const http::Site& site) override {
    if (!site.has_route(route_pattern_)) close_from_server(1012, "service restart");
  }
  void force_close() override { abort("closed at close_timeout"); }

  void set_identity(std::vector<http::Param> params, std::optional<http::Principal> principal,
                    std::string protocol, std::string pattern) {
    params_ = std::move(params);
    principal_ = std::move(principal);
    protocol_ = std::move(protocol);
    pattern_ = pattern;
    route_pattern_ = std::move(pattern);
  }

 private:
  // kOpen: messages both ways. kClosing: our close frame is queued or sent; waiting for the
  // peer's. kDraining: the exchange is over (or failed); write side shut down, dropping input
  // until EOF or the close timeout. kDone: closed.
  enum class State { kOpen, kClosing, kDraining, kDone };

  bool send(Opcode op, std::string_view payload) {
    if (state_ != State::kOpen) return false;
    encoder_.encode_message(op, payload, out_);
    return queued();
  }

  // Every frame goes out through here, data and control alike (pongs, pings, close frames): they
  // all count against max_buffered. Over it the peer is not reading: it would not read a close
  // frame either, so the connection is dropped at once and its memory freed (1008 to on_close and
  // the log). false: dropped.
  bool queued() {
    if (out_.size() <= limits_.max_buffered) {
      schedule_flush();
      return true;
    }
    server_.log().warn("ws_output_cap", "remote={} pattern=\"{}\" buffered={} cap={} code=1008",
                       remote_address_, pattern_, out_.size(), limits_.max_buffered);
    drop(kClosePolicyViolation, "output buffer limit");
    return false;
  }

  void drop(uint16_t code, const char* reason) {
    report_close(code, reason);
    abort(nullptr);
  }

  void close_from_server(uint16_t code, std::string_view reason) {
    if (state_ == State::kOpen) start_close(code, reason, code);
  }

  void start_close(uint16_t code, std::string_view reason, uint16_t report_code) {
    encoder_.encode_close(code, reason, out_);
    state_ = State::kClosing;
    close_code_ = report_code;
    close_reason_.assign(reason);
    timer_.arm_after(limits_.close_timeout_ms);
    queued();
  }

  void schedule_flush() {
    if (flush_scheduled_) return;
    flush_scheduled_ = true;
    loop_.defer([this] {
      flush_scheduled_ = false;
      if (state_ != State::kDone) flush();
    });
  }

  void on_io(uint32_t events) override {
    if (state_ == State::kDone) return;
    if (events & EPOLLOUT) flush();
    if (state_ == State::kDone) return;
    if (events & EPOLLIN) {
      on_readable();
    } else if (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
      report_close(1006, "connection lost");
      abort(nullptr);
    }
  }

  void on_readable() {
    auto r = transport_->read_into(in_, kReadSize);  // TLS: with what the session holds back
    if (r.ok()) {
      last_rx_ = loop_.now();
      if (state_ == State::kDraining) {
        in_.clear();
      } else {
        decode();
      }
      if (state_ != State::kDone) flush();
      return;
    }
    if (r.again()) return;
    if (state_ != State::kDraining) report_close(1006, "connection lost");
    abort(nullptr);
  }

  void decode() {
    size_t used = decoder_.feed(in_.view(), *this);
    in_.consume(used);
    if (decoder_.done()) in_.clear();
  }

  // FrameHandler
  void on_message(Opcode opcode, std::string_view payload) override {
    if (state_ != State::kOpen || !on_message_cb()) return;
    Socket::on_message(*this, payload, opcode == Opcode::kBinary);
  }
  void on_ping(std::string_view payload) override {
    if (state_ != State::kOpen && state_ != State::kClosing) return;
    if (pong_left_ > 0 && blocked_) {
      // Our last pong is still queued behind a socket the peer does not read: answer only the
      // most recent ping once it is out (RFC 6455 §5.5.3), so a ping flood costs one 125-byte
      // slot, not a pong each.
      owed_pong_.assign(payload);
      pong_owed_ = true;
      if (++coalesced_pings_ > kMaxCoalescedPings) {
        server_.log().warn("ws_ping_flood",
                           "remote={} pattern=\"{}\" unanswered={} buffered={} code=1008",
                           remote_address_, pattern_, coalesced_pings_, out_.size());
        drop(kClosePolicyViolation, "ping flood");
      }
      return;
    }
    queue_pong(payload);
  }

  void queue_pong(std::string_view payload) {
    encoder_.encode(Opcode::kPong, payload, out_);
    pong_left_ = out_.size();
    queued();
  }
  void on_pong(std::string_view) override {}
  void on_close(uint16_t code, std::string_view reason) override {
    if (state_ == State::kOpen) {
      // The peer closes: echo its code (an empty close gets an empty close), then finish.
      encoder_.encode_close(code == kCloseNoStatus ? 0 : code, {}, out_);
      report_close(code, reason);
      if (!queued()) return;
    } else {
      report_close(close_code_, close_reason_);  // the answer to our close
    }
    finish();
  }
  void on_error(uint16_t close_code, std::string_view reason) override {
    server_.log().info("ws_protocol_error", "remote={} pattern=\"{}\" code={} reason=\"{}\"",
                       remote_address_, pattern_, close_code, reason);
    if (state_ == State::kOpen) encoder_.encode_close(close_code, reason, out_);
    report_close(close_code, reason);
    if (!queued()) return;
    finish();
  }

  bool on_message_cb() const { return static_cast<bool>(Socket::on_message); }

  // The closing exchange is over: write what is queued, shut down our side, drop what still comes.
  void finish() {
    if (state_ == State::kDraining || state_ == State::kDone) return;
    state_ = State::kDraining;
    // Our FIN follows the close frames; waiting for the client's FIN only keeps a reset from
    // destroying them, so a short linger is enough.
    timer_.arm_after(std::min<uint32_t>(limits_.close_timeout_ms, kLingerMs));
    schedule_flush();
  }

  void report_close(uint16_t code, std::string_view reason) {
    if (reported_) return;
    reported_ = true;
    if (Socket::on_close) {
      auto cb = std::move(Socket::on_close);
      cb(*this, code, reason);
    }
    Socket::on_message = nullptr;
  }

  void on_timer() {
    if (state_ == State::kDone) return;
    if (state_ == State::kClosing) {  // the peer never answered our close frame
      report_close(close_code_, close_reason_);
      abort(nullptr);
      return;
    }
    if (state_ == State::kDraining) {
      abort(nullptr);
      return;
    }
    uint64_t silent = loop_.now() - last_rx_;
    if (silent >= limits_.idle_timeout_ms) {
      // Timers run before this round's I/O: an answer may already be waiting. Look first.
      on_readable();
      if (state_ != State::kOpen) return;
      silent = loop_.now() - last_rx_;
    }
    if (silent >= limits_.idle_timeout_ms) {
      start_close(kCloseGoingAway, "idle timeout", kCloseGoingAway);
      flush();
      return;
    }
    if (silent >= limits_.ping_interval_ms) {
      encoder_.encode(Opcode::kPing, {}, out_);
      if (!queued()) return;
      flush();
    }
    uint64_t next = limits_.ping_interval_ms;
    if (limits_.idle_timeout_ms - silent < next) next = limits_.idle_timeout_ms - silent;
    timer_.arm_after(next ? next : 1);
  }

  void flush() {
    if (state_ == State::kDone) return;
    while (!out_.empty()) {
      auto w = transport_->write(out_.data(), out_.size());
      if (w.ok()) {
        out_.consume(w.bytes);
        if (pong_left_ > 0) {
          pong_left_ -= std::min(pong_left_, w.bytes);
          if (pong_left_ == 0) {
            coalesced_pings_ = 0;  // the peer reads: our pongs get through
            if (pong_owed_ && (state_ == State::kOpen || state_ == State::kClosing)) {
              pong_owed_ = false;
              encoder_.encode(Opcode::kPong, owed_pong_, out_);
              pong_left_ = out_.size();  // at most 127 bytes, after bytes just went out
            }
          }
        }
        continue;
      }
      if (w.again()) break;
      report_close(1006, "connection lost");
      abort(nullptr);
      return;
    }
    blocked_ = !out_.empty();  // only EAGAIN leaves bytes behind
    if (state_ == State::kDraining && out_.empty() && !shut_) {
      shut_ = true;
      transport_->shutdown();  // TLS: close_notify first
    }
    uint32_t want = EPOLLIN | (out_.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
    if (want != interest_) {
      interest_ = want;
      (void)loop_.modify(transport_->fd(), want, this);
    }
  }

  void abort(const char* why) {
    if (state_ == State::kDone) return;
    if (why) server_.log().info("ws_closed", "remote={} reason=\"{}\"", remote_address_, why);
    report_close(1006, why ? why : "connection lost");
    state_ = State::kDone;
    decoder_.stop();  // dropped from a frame callback: feed() returns at once
    timer_.cancel();
    if (transport_) {
      loop_.remove(transport_->fd());
      transport_.reset();
    }
    if (attached_) {
      attached_ = false;
      server_.detach(this);
    }
    loop_.destroy_later(std::unique_ptr<Connection>(this));
  }

  core::EventLoop& loop_;
  http::Server& server_;
  std::unique_ptr<core::Transport> transport_;  // plain or TLS; null once closed
  // shared with the route: a socket may outlive the Site that opened it (until it closes after a
  // swap), so the route's options are freed by the last of them.
  std::shared_ptr<const SocketRoute> route_;
  SocketLimits limits_;
  FrameDecoder decoder_;
  FrameEncoder encoder_;
  core::Timer timer_;
  core::Buffer in_;
  core::Buffer out_;
  State state_ = State::kOpen;
  uint32_t interest_ = 0;
  uint64_t last_rx_ = 0;
  uint16_t close_code_ = kCloseNormal;
  std::string close_reason_;
  std::string route_pattern_;
  bool flush_scheduled_ = false;
  bool reported_ = false;
  bool attached_ = false;
  bool shut_ = false;
  // Pong coalescing (on_ping): bytes of out_ up to the end of the last queued pong (0: none
  // queued), whether the last flush left output behind, the latest ping not yet answered.
  size_t pong_left_ = 0;
  bool blocked_ = false;
  bool pong_owed_ = false;
  size_t coalesced_pings_ = 0;
  std::string owed_pong_;
};

class SocketUpgrade final : public http::UpgradeHandler {
 public:
  SocketUpgrade(std::shared_ptr<const SocketRoute> route, SocketLimits limits, Handshake h,
                const http::Request& req)
      : route_(std::move(route)), limits_(limits), handshake_(std::move(h)) {
    params_ = req.params;
    principal_ = req.principal;
    pattern_ = std::string(req.pattern);
  }
  void take_over(http::UpgradeContext ctx) override {
    auto* c = new Connection(std::move(ctx), route_, limits_, handshake_.deflate);
    c->set_identity(std::move(params_), std::move(principal_), handshake_.protocol,
                    std::move(pattern_));
    c->start();  // owns itself from here: destroyed on the loop after it closes
  }

 private:
  std::shared_ptr<const SocketRoute> route_;
  SocketLimits limits_;
  Handshake handshake_;
  std::vector<http::Param> params_;
  std::optional<http::Principal> principal_;
  std::string pattern_;
};

}  // namespace

void add_socket_route(http::SiteBuilder& site, std::string pattern, SocketRoute route) {
  if (!pattern.empty() && pattern.front() == '/') pattern = "GET " + pattern;
  // shared with every socket the route opens (see Connection::route_).
  auto shared = std::make_shared<const SocketRoute>(std::move(route));
  site.route(pattern, [shared](http::Request& req) -> http::Response {
    auto h = check_handshake(req, shared->handshake);
    if (h.status) return refusal(h);
    SocketLimits limits = shared->limits ? shared->limits(req) : SocketLimits{};
    auto r = http::Response::upgrade(std::make_unique<SocketUpgrade>(shared, limits, h, req));
    r.header("Upgrade", "websocket");
    r.header("Connection", "Upgrade");
    r.header("Sec-WebSocket-Accept", h.accept);
    if (!h.protocol.empty()) r.header("Sec-WebSocket-Protocol", h.protocol);
    if (!h.extensions.empty()) r.header("Sec-WebSocket-Extensions", h.extensions);
    return r;
  });
}

}  // namespace corral::ws
