// MessageLink: a message channel over a SOCK_SEQPACKET socket on the event loop (one message per
// packet, so no framing): the supervisor and each server process talk over one; the worker manager
// and each worker too. Outgoing messages queue while the socket is full; on_closed fires once when
// the peer goes away (EOF or error). Messages are opaque bytes here (JSON by convention).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <string_view>

#include "core/event_loop.h"
#include "core/unique_fd.h"

namespace corral::core {

class MessageLink final : public IoHandler {
 public:
  static constexpr size_t kMaxMessage = 64 * 1024;

  MessageLink(EventLoop& loop, UniqueFd fd);
  ~MessageLink();
  MessageLink(const MessageLink&) = delete;
  MessageLink& operator=(const MessageLink&) = delete;

  void send(std::string message);
  bool open() const { return fd_.valid(); }
  void close();

  std::function<void(std::string_view message)> on_message;
  std::function<void()> on_closed;

  void on_io(uint32_t events) override;

 private:
  void flush();
  void fail();

  EventLoop& loop_;
  UniqueFd fd_;
  std::deque<std::string> queue_;
  bool want_out_ = false;
};

}  // namespace corral::core
