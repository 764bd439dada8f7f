#include "tls/transport.h"

#include <errno.h>
#include <sys/socket.h>

namespace corral::tls {

namespace {

// Session::read()/send() keep the ::read()/::send() conventions (session.h).
core::IoResult from_session(ssize_t r) {
  return core::IoResult::from_errno(r, errno);
}

}  // namespace

core::Result<std::unique_ptr<TlsTransport>> TlsTransport::accept(const ServerConfig& config,
                                                                 core::UniqueFd fd) {
  auto s = Session::accept(config, fd.get());
  if (!s) return s.error();
  return std::make_unique<TlsTransport>(std::move(fd), std::move(s.value()));
}

TlsTransport::TlsTransport(core::UniqueFd fd, SessionPtr session)
    : fd_(std::move(fd)), session_(std::move(session)) {}

core::Transport::Step TlsTransport::handshake() {
  switch (session_->handshake()) {
    case Session::Step::kDone:
      return Step::kDone;
    case Session::Step::kWantRead:
      return Step::kWantRead;
    case Session::Step::kWantWrite:
      return Step::kWantWrite;
    case Session::Step::kFailed:
      break;
  }
  return Step::kFailed;
}

std::string_view TlsTransport::error() const {
  return session_->error();
}

core::IoResult TlsTransport::read(char* buf, size_t n) {
  ssize_t r;
  do {
    r = session_->read(buf, n);
  } while (r < 0 && errno == EINTR);
  return from_session(r);
}

core::IoResult TlsTransport::write(const char* data, size_t n) {
  ssize_t r;
  do {
    r = session_->send(data, n);  // after EINTR: the same bytes again, as GnuTLS requires
  } while (r < 0 && errno == EINTR);
  if (r == 0) return {core::IoResult::Status::kAgain, 0, 0};
  return from_session(r);
}

core::IoResult TlsTransport::writev(const iovec* iov, int count) {
  size_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (iov[i].iov_len == 0) continue;
    core::IoResult r = write(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
    if (!r.ok()) {
      // What went out before counts; the caller retries from the buffer that blocked, which is
      // the "same bytes at the front" GnuTLS needs after EAGAIN.
      return total ? core::IoResult::done(total) : r;
    }
    total += r.bytes;
    if (r.bytes < iov[i].iov_len) break;  // a partial record: the caller comes back for the rest
  }
  if (total == 0) return {core::IoResult::Status::kAgain, 0, 0};
  return core::IoResult::done(total);
}

size_t TlsTransport::pending() const {
  return session_->pending();
}

void TlsTransport::shutdown() {
  session_->bye();
  ::shutdown(fd_.get(), SHUT_WR);
}

core::IoResult TlsTransport::send_file(int, uint64_t, size_t) {
  return {core::IoResult::Status::kError, 0, EOPNOTSUPP};
}

core::Result<std::unique_ptr<core::Transport>> TlsTransportFactory::wrap(core::UniqueFd fd) const {
  auto t = TlsTransport::accept(*config_, std::move(fd));
  if (!t) return t.error();
  return std::unique_ptr<core::Transport>(std::move(t.value()));
}

}  // namespace corral::tls
