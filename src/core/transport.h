// Transport: the one place that knows how a connection's bytes move (Envoy's TransportSocket).
// Protocol code (the HTTP/1.1 connection, the WebSocket, the relay of an upgraded connection)
// reads, writes and shuts down through it and never asks whether the bytes are encrypted.
//
// PlainTransport is a TCP (or Unix) socket: each call is one syscall, so the keep-alive path costs
// what it cost before this interface existed (one read, one write per request; the price is a
// virtual call). tls::TlsTransport (tls/transport.h) runs the same calls through a GnuTLS session.
//
// The rules a caller keeps, whatever the transport:
//  * read_into() is the read to use before waiting for EPOLLIN again: a transport may hold bytes
//    it already received and decrypted where epoll cannot see them (pending()); read_into()
//    takes those too, so nothing is left that only a next event would deliver.
//  * a write() or writev() that returned kAgain is called again with the same bytes at the front
//    (more may follow them): TLS has encrypted the record already.
//  * handshake() is called while it returns kWantRead/kWantWrite, when the fd is readable or
//    writable; a plain transport is done at once, without a syscall.
//
// TransportFactory wraps an accepted socket: a listener is given one (or none: plain TCP), so the
// server never names the TLS types. A factory is shared by every listener of a reload
// generation. A transport may borrow from what its factory holds (TLS: the credentials), so that
// must stay alive while the factory's connections run, upgraded ones included.
//
// Lifetime: a Transport owns its fd (closed on destruction) and belongs to one connection at a
// time; an upgraded connection hands it on as std::unique_ptr<Transport>. One thread.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/buffer.h"
#include "core/result.h"
#include "core/unique_fd.h"

namespace corral::core {

// What one read or write did: bytes moved (kOk, bytes > 0), or why none moved.
struct IoResult {
  enum class Status : uint8_t {
    kOk,
    kAgain,  // would block: wait for the fd (EINTR is retried inside)
    kEof,    // read: the peer closed (a TLS close_notify, or a FIN); send_file: the file ended
    kError,  // `error` is an errno value (ECONNRESET, EPIPE, EPROTO for a TLS failure, ...)
  };
  Status status = Status::kOk;
  size_t bytes = 0;
  int error = 0;

  bool ok() const { return status == Status::kOk; }
  bool again() const { return status == Status::kAgain; }
  static IoResult done(size_t n) { return {Status::kOk, n, 0}; }
  // From a syscall's -1 (errno) or 0 (end of stream).
  static IoResult from_errno(ssize_t r, int err);
};

class Transport {
 public:
  enum class Step : uint8_t { kDone, kWantRead, kWantWrite, kFailed };

  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The socket, for epoll. Valid for the transport's life.
  virtual int fd() const = 0;
  // Drives the handshake (see above); kFailed: error() says why, the connection is closed.
  virtual Step handshake() = 0;
  // Why the handshake or the last read/write failed, for logs (empty for a plain socket: the
  // errno in IoResult says it).
  virtual std::string_view error() const { return {}; }

  // One read of at most n bytes (may leave bytes in pending()).
  virtual IoResult read(char* buf, size_t n) = 0;
  virtual IoResult write(const char* data, size_t n) = 0;
  // Writes the buffers in order; a partial write stops anywhere, even inside a buffer.
  virtual IoResult writev(const iovec* iov, int count) = 0;
  // Bytes this transport holds, received and ready to read, that epoll will not report.
  virtual size_t pending() const = 0;
  // Ends our sending side: a TLS close_notify (one best-effort try), then a TCP FIN. Reading goes
  // on (a linger drains what the peer still sends).
  virtual void shutdown() = 0;

  // Whether send_file() works: a plain socket sends file pages with sendfile(); TLS must copy
  // them through the output (pread, then write()).
  virtual bool can_send_file() const = 0;
  // Up to n bytes of `file_fd` from `offset`. kEof: the file ended before n.
  virtual IoResult send_file(int file_fd, uint64_t offset, size_t n) = 0;
  // The bytes are protected (the request's scheme is "https").
  virtual bool secure() const = 0;

  // Reads at most `n` bytes into `into`, then what pending() still holds: afterwards waiting for
  // EPOLLIN is safe. The result counts every byte appended.
  IoResult read_into(Buffer& into, size_t n);

 protected:
  Transport() = default;
};

// A socket as it is: read(), sendmsg() (MSG_NOSIGNAL), sendfile(), shutdown(SHUT_WR).
class PlainTransport final : public Transport {
 public:
  explicit PlainTransport(UniqueFd fd) : fd_(std::move(fd)) {}

  int fd() const override { return fd_.get(); }
  Step handshake() override { return Step::kDone; }
  IoResult read(char* buf, size_t n) override;
  IoResult write(const char* data, size_t n) override;
  IoResult writev(const iovec* iov, int count) override;
  size_t pending() const override { return 0; }
  void shutdown() override;
  bool can_send_file() const override { return true; }
  IoResult send_file(int file_fd, uint64_t offset, size_t n) override;
  bool secure() const override { return false; }

 private:
  UniqueFd fd_;
};

// Wraps an accepted, connected, non-blocking socket in a transport. An error closes the socket.
class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  virtual Result<std::unique_ptr<Transport>> wrap(UniqueFd fd) const = 0;
};

}  // namespace corral::core
