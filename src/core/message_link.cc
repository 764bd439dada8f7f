#include "core/message_link.h"

#include <errno.h>
#include <sys/socket.h>

namespace corral::core {

MessageLink::MessageLink(EventLoop& loop, UniqueFd fd) : loop_(loop), fd_(std::move(fd)) {
  if (fd_ && !loop_.add(fd_.get(), EPOLLIN, this)) fd_.reset();
}

MessageLink::~MessageLink() {
  // Whoever holds a pointer to this link learns it is gone, even if no EOF was seen first.
  if (fd_ && on_closed) {
    close();
    auto cb = std::move(on_closed);
    cb();
    return;
  }
  close();
}

void MessageLink::close() {
  if (!fd_) return;
  loop_.remove(fd_.get());
  fd_.reset();
}

void MessageLink::send(std::string message) {
  if (!fd_) return;
  queue_.push_back(std::move(message));
  flush();
}

void MessageLink::flush() {
  while (fd_ && !queue_.empty()) {
    ssize_t n = ::send(fd_.get(), queue_.front().data(), queue_.front().size(),
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      queue_.pop_front();
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;
    fail();
    return;
  }
  bool want = fd_ && !queue_.empty();
  if (fd_ && want != want_out_) {
    want_out_ = want;
    (void)loop_.modify(fd_.get(), EPOLLIN | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u), this);
  }
}

void MessageLink::fail() {
  close();
  if (on_closed) {
    auto cb = std::move(on_closed);
    on_closed = nullptr;
    cb();
  }
}

void MessageLink::on_io(uint32_t events) {
  if (!fd_) return;
  if (events & EPOLLOUT) flush();
  if (!fd_) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    char buf[kMaxMessage];
    for (int i = 0; i < 64 && fd_; ++i) {  // a bounded batch per wakeup
      ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (on_message) on_message(std::string_view(buf, static_cast<size_t>(n)));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      fail();  // 0: the peer closed (a SEQPACKET socket never sends an empty message here)
      return;
    }
  }
}

}  // namespace corral::core
