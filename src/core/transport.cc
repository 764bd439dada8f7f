#include "core/transport.h"

#include <errno.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

namespace corral::core {

IoResult IoResult::from_errno(ssize_t r, int err) {
  if (r > 0) return done(static_cast<size_t>(r));
  if (r == 0) return {Status::kEof, 0, 0};
  if (err == EAGAIN || err == EWOULDBLOCK) return {Status::kAgain, 0, 0};
  return {Status::kError, 0, err};
}

IoResult Transport::read_into(Buffer& into, size_t n) {
  IoResult r = read(into.reserve(n), n);
  if (!r.ok()) return r;
  into.commit(r.bytes);
  // The one loop for bytes epoll cannot see (a TLS record decrypted in part, records that came
  // in the same segment): bounded by what the transport buffered, a few records.
  while (pending() > 0) {
    IoResult more = read(into.reserve(n), n);
    if (!more.ok()) break;  // an error or EOF shows again on the next read
    into.commit(more.bytes);
    r.bytes += more.bytes;
  }
  return r;
}

IoResult PlainTransport::read(char* buf, size_t n) {
  ssize_t r;
  do {
    r = ::read(fd_.get(), buf, n);
  } while (r < 0 && errno == EINTR);
  return IoResult::from_errno(r, errno);
}

IoResult PlainTransport::write(const char* data, size_t n) {
  ssize_t r;
  do {
    r = ::send(fd_.get(), data, n, MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return {IoResult::Status::kAgain, 0, 0};  // nothing taken: not an end
  return IoResult::from_errno(r, errno);
}

IoResult PlainTransport::writev(const iovec* iov, int count) {
  // sendmsg, not writev(): MSG_NOSIGNAL, so a peer gone away is EPIPE, not SIGPIPE.
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  ssize_t r;
  do {
    r = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return {IoResult::Status::kAgain, 0, 0};
  return IoResult::from_errno(r, errno);
}

void PlainTransport::shutdown() {
  ::shutdown(fd_.get(), SHUT_WR);
}

IoResult PlainTransport::send_file(int file_fd, uint64_t offset, size_t n) {
  off_t off = static_cast<off_t>(offset);
  ssize_t r;
  do {
    r = ::sendfile(fd_.get(), file_fd, &off, n);
  } while (r < 0 && errno == EINTR);
  return IoResult::from_errno(r, errno);
}

}  // namespace corral::core
