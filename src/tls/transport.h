// TlsTransport: core::Transport over a tls::Session, so the HTTP/1.1 connection, the WebSocket
// and the relay speak TLS without knowing it (core/transport.h has the rules they keep).
//
// Reads and writes go through GnuTLS records; pending() is what the session decrypted or read
// ahead but did not return (epoll cannot see it: core::Transport::read_into() drains it). A file
// cannot be sent with sendfile() (can_send_file() is false): the connection copies it through
// write(). shutdown() sends close_notify (one try) and then the TCP FIN.
//
// TlsTransportFactory is what a TLS listener is given (http::Server::listen, RunOptions::tls): it
// holds one reload generation's ServerConfig and wraps each accepted socket in a server session.
//
// Lifetime: a TlsTransport owns the socket and the session (the session is destroyed first). A
// session borrows the config's credentials: the factory shares the config (shared_ptr, also held
// by the process's other users, HTTP/3), and whoever built it keeps the config alive while TLS
// connections run (the cli's prepared state does, for the life of the process). One thread.
#pragma once

#include <memory>
#include <string_view>

#include "core/result.h"
#include "core/transport.h"
#include "core/unique_fd.h"
#include "tls/session.h"
#include "tls/session_ptr.h"

namespace corral::tls {

class TlsTransport final : public core::Transport {
 public:
  // A server session over `fd` (accepted, non-blocking); nothing is sent until handshake().
  static core::Result<std::unique_ptr<TlsTransport>> accept(const ServerConfig& config,
                                                            core::UniqueFd fd);
  TlsTransport(core::UniqueFd fd, SessionPtr session);

  int fd() const override { return fd_.get(); }
  Step handshake() override;
  std::string_view error() const override;
  core::IoResult read(char* buf, size_t n) override;
  core::IoResult write(const char* data, size_t n) override;
  // One record (or more, for a buffer over 16 KiB) per buffer: GnuTLS has no vectored send.
  core::IoResult writev(const iovec* iov, int count) override;
  size_t pending() const override;
  void shutdown() override;
  bool can_send_file() const override { return false; }
  core::IoResult send_file(int file_fd, uint64_t offset, size_t n) override;
  bool secure() const override { return true; }

  Session& session() { return *session_; }  // ALPN, version, resumption (logs, tests)

 private:
  core::UniqueFd fd_;
  SessionPtr session_;  // over fd_; declared after it, so destroyed before the socket closes
};

class TlsTransportFactory final : public core::TransportFactory {
 public:
  explicit TlsTransportFactory(std::shared_ptr<const ServerConfig> config)
      : config_(std::move(config)) {}
  core::Result<std::unique_ptr<core::Transport>> wrap(core::UniqueFd fd) const override;

 private:
  std::shared_ptr<const ServerConfig> config_;
};

}  // namespace corral::tls
