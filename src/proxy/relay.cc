#include "proxy/relay.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/buffer.h"
#include "core/event_loop.h"
#include "http/server.h"
#include "tls/session.h"

namespace corral::proxy {

namespace {

// Relays bytes both ways between an upgraded client connection and the upstream. Owns itself
// once started; attached to the Server as an Upgraded connection.
class Relay final : public http::Upgraded {
 public:
  static constexpr size_t kHigh = 256 * 1024;

  Relay(core::EventLoop& loop, http::Server& server, core::UniqueFd client,
        tls::SessionPtr client_tls, core::UniqueFd upstream)
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
  void site_replaced(const http::Site&) override {}
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
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_side(s);
    if (done_) return;
    update(s);
    update(*s.peer);
    if (a_.eof && b_.eof && a_.out.empty() && b_.out.empty()) finish();
  }

  // What `s` sent goes to its peer's queue.
  void read_side(Side& s) {
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
  http::Server& server_;
  Side a_;  // the client
  Side b_;  // the upstream
  bool done_ = false;
};

}  // namespace

void RelayUpgrade::take_over(http::UpgradeContext ctx) {
  auto* relay =
      new Relay(ctx.loop, ctx.server, std::move(ctx.fd), std::move(ctx.tls), std::move(upstream_));
  // To the client: the 101's unsent bytes, then what the upstream already sent after its 101.
  relay->start(std::move(ctx.leftover_input), ctx.pending_output + leftover_);
}

}  // namespace corral::proxy
