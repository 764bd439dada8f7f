#include "proxy/relay.h"

#include "core/buffer.h"
#include "core/event_loop.h"
#include "core/transport.h"
#include "http/server.h"

namespace corral::proxy {

namespace {

// Relays bytes both ways between an upgraded client connection and the upstream. Owns itself
// once started; attached to the Server as an Upgraded connection.
class Relay final : public http::Upgraded {
 public:
  static constexpr size_t kHigh = 256 * 1024;

  Relay(core::EventLoop& loop, http::Server& server, std::unique_ptr<core::Transport> client,
        core::UniqueFd upstream)
      : loop_(loop), server_(server) {
    a_.relay = b_.relay = this;
    a_.io = std::move(client);
    b_.io = std::make_unique<core::PlainTransport>(std::move(upstream));
    a_.peer = &b_;
    b_.peer = &a_;
  }
  void start(std::string to_upstream, std::string to_client) {
    server_.attach(this);
    b_.out.append(to_upstream);
    a_.out.append(to_client);
    for (Side* s : {&a_, &b_}) {
      s->interest = EPOLLIN;
      if (!loop_.add(s->io->fd(), s->interest, s)) return finish();
    }
    flush(a_);
    flush(b_);
  }
  void server_closing() override {}  // relayed bytes are the upstream's business; close_ms cuts
  void site_replaced(const http::Site&) override {}
  void force_close() override { finish(); }

 private:
  struct Side final : core::IoHandler {
    Relay* relay = nullptr;
    Side* peer = nullptr;
    std::unique_ptr<core::Transport> io;  // the client's (plain or TLS); the upstream's plain
    core::Buffer out;                     // bytes for this side
    bool eof = false;                     // this side sent FIN
    bool shut = false;                    // we sent FIN to this side
    uint32_t interest = 0;
    void on_io(uint32_t events) override { relay->on_io(*this, events); }
  };

  void on_io(Side& s, uint32_t events) {
    if (done_) return;
    if (events & EPOLLOUT) flush(s);
    if (done_) return;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_side(s);
    if (done_) return;
    update(s);
    update(*s.peer);
    if (a_.eof && b_.eof && a_.out.empty() && b_.out.empty()) finish();
  }

  // What `s` sent goes to its peer's queue.
  void read_side(Side& s) {
    Side& to = *s.peer;
    auto r = s.io->read_into(to.out, 16384);  // TLS: with what the session holds back
    if (r.ok()) {
      flush(to);
    } else if (!r.again()) {
      if (r.status == core::IoResult::Status::kError) return finish();
      s.eof = true;
      flush(to);  // passes the FIN on once its queue is out
    }
  }

  void flush(Side& s) {
    while (!s.out.empty()) {
      auto w = s.io->write(s.out.data(), s.out.size());
      if (w.ok()) {
        s.out.consume(w.bytes);
        continue;
      }
      if (w.again()) break;
      return finish();
    }
    if (s.out.empty() && s.peer->eof && !s.shut) {
      s.shut = true;
      s.io->shutdown();  // TLS: close_notify first
    }
    update(s);
  }

  void update(Side& s) {
    if (done_ || !s.io) return;
    uint32_t want = 0;
    if (!s.eof && s.peer->out.size() < kHigh) want |= EPOLLIN;
    if (!s.out.empty()) want |= EPOLLOUT;
    if (want != s.interest) {
      s.interest = want;
      (void)loop_.modify(s.io->fd(), want, &s);
    }
  }

  void finish() {
    if (done_) return;
    done_ = true;
    for (Side* s : {&a_, &b_}) {
      if (s->io) {
        loop_.remove(s->io->fd());
        s->io.reset();
      }
    }
    server_.detach(this);
    loop_.destroy_later(std::unique_ptr<Relay>(this));
  }

  core::EventLoop& loop_;
  http::Server& server_;
  Side a_;  // the client
  Side b_;  // the upstream
  bool done_ = false;
};

}  // namespace

void RelayUpgrade::take_over(http::UpgradeContext ctx) {
  auto* relay = new Relay(ctx.loop, ctx.server, std::move(ctx.transport), std::move(upstream_));
  // To the client: the 101's unsent bytes, then what the upstream already sent after its 101.
  relay->start(std::move(ctx.leftover_input), ctx.pending_output + leftover_);
}

}  // namespace corral::proxy
