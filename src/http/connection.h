// Connection: one HTTP/1.1 client connection: the transport, the buffers, the parser, the timers
// and pipelining. The request's life (admission, the Site, the ResponsePlan, the body producers,
// the access log) is its Exchange's (exchange.h), one per connection, reused for each request;
// the connection is that exchange's ExchangeStream and writes what it is given with the HTTP/1.1
// writer (h1_writer.h).
//
// Syscalls per request on the keep-alive path: one read() for every request that fit in it and
// one write() for all their responses (pipelined responses are batched into one buffer). Files go
// out with sendfile(); streams are chunked when their length is unknown and pull more data only
// when the output queue is below its low-water mark.
//
// Every byte moves through a core::Transport (core/transport.h), plain or TLS, given by the
// listener's factory: the connection first drives the transport's handshake under the header
// timeout (a plain one is done at once), then reads with read_into() (which also takes the bytes
// a TLS session decrypted but epoll cannot see) and writes through it. A transport that cannot
// sendfile() (TLS) gets files pread() into the output buffer: one record send per 16 KiB.
//
// A route that streams its request body (RouteOptions::stream_body, body_stream.h) runs once the
// head is parsed; the exchange is then the request's BodyStream and the connection reads the
// socket only while the consumer takes pieces (one read, 16 KiB, at a time), and a response that
// ends before the body did closes the connection.
//
// Lifetime: owned by the Server (intrusive list); destroyed through EventLoop::destroy_later
// after close_now(), so an event already queued for it finds live memory and a closed flag.
#pragma once

#include <memory>
#include <string>

#include "core/buffer.h"
#include "core/event_loop.h"
#include "core/socket.h"
#include "core/timer_wheel.h"
#include "core/transport.h"
#include "http/admission.h"
#include "http/exchange.h"
#include "http/file_response.h"
#include "http/parser.h"
#include "http/request.h"
#include "http/response.h"
#include "http/response_plan.h"

namespace corral::http {

class Server;
class Site;

class Connection final : public core::IoHandler, private ExchangeStream, private BodyRules {
 public:
  Connection(Server& server, std::unique_ptr<core::Transport> transport,
             const core::SocketAddress& peer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start();
  void on_io(uint32_t events) override;
  // Graceful close: idle -> closed now; busy -> closed after the current response.
  void begin_close();
  void close_now();
  // The site was published while this connection waited for it.
  void site_ready();
  // The admission policy changed: close if this connection's host is no longer allowed.
  void policy_changed();
  bool closed() const { return closed_; }

  Connection* prev_ = nullptr;  // Server's intrusive list
  Connection* next_ = nullptr;

 private:
  enum class Phase { kIdle, kHead, kBody, kWaitingSite, kResponding, kLingering };
  enum class ReadTimer { kNone, kHeader, kBody, kIdle, kReady, kLinger };

  void on_readable();
  void continue_handshake();
  void process_input();
  void dispatch();
  void respond_error(int status, std::string_view reason);
  void finish_request();
  void flush();
  bool send_file_data();
  void schedule_flush();
  void update_interest();
  void arm_read_timer(ReadTimer kind, uint32_t ms);
  void cancel_body_timer();
  void on_read_timer();
  void start_linger();
  void hand_over();  // after a 101: the socket goes to the upgrade handler
  // ExchangeStream: the exchange's response goes out through out_ (h1_writer.h).
  bool keep_alive() const override;
  void send_head(ResponsePlan& plan) override;
  void send_file(FileCursor& file) override;
  bool send_data(std::string_view data) override;
  void end_stream() override;
  void reset_stream() override;
  size_t buffered() const override { return out_.size(); }
  bool can_upgrade() const override { return true; }
  void upgrade(std::unique_ptr<UpgradeHandler> handler) override;
  void responded_later() override;
  void admitted(const Request& req) override;
  void request_body_wanted() override;
  void request_body_detached() override;
  void request_body_abandoned() override;
  std::optional<uint64_t> request_body_length() const override;
  // BodyRules: the route's, asked by the parser for a head with a body.
  BodyRule body_rule(Request& req) override;
  // A streamed body: the route runs at the head; pieces go to the consumer as they come.
  void start_body_stream();
  void schedule_body_pump();
  void pump_body();
  // The body cannot be complete: the consumer hears why; the client gets `status` if no response
  // head went out yet, else the connection closes.
  void fail_body(int status, std::string_view why);

  Server& server_;
  core::EventLoop& loop_;
  std::unique_ptr<core::Transport> transport_;  // null once closed or handed over
  bool handshaking_ = true;                     // until transport_->handshake() is done
  bool secure_ = false;                         // transport_->secure(), asked once
  core::SocketAddress peer_;
  Peer peer_info_;  // the peer's address, parsed once for admission
  std::string peer_ip_;
  core::Buffer in_;
  core::Buffer out_;
  std::string head_copy_;
  RequestParser parser_;
  Exchange exchange_;  // the request in flight; one per connection, reused
  core::Timer read_timer_;
  core::Timer write_timer_;
  ReadTimer read_timer_kind_ = ReadTimer::kNone;
  Phase phase_ = Phase::kIdle;
  uint32_t interest_ = 0;
  bool closed_ = false;
  bool closing_ = false;  // draining: the next response is the last
  bool close_after_write_ = false;
  bool peer_eof_ = false;
  bool flush_scheduled_ = false;
  bool in_process_ = false;
  bool stream_chunked_ = false;       // the stream's data goes out as chunks
  bool file_active_ = false;          // a body is being sent after out_: a file, or big_body_
  bool body_pump_scheduled_ = false;  // a pump_body() is deferred
  bool continue_sent_ = false;        // the 100 Continue of this request
  bool peer_shut_ = false;            // EPOLLRDHUP seen while a body streams: read on to its EOF
  std::string admitted_host_;
  FileCursor* file_ = nullptr;  // the exchange's file body being sent (file_active_)
  std::string big_body_;        // a large string body, sent in place
  size_t big_off_ = 0;
  std::unique_ptr<UpgradeHandler> upgrade_;  // set by a 101 response until hand_over()
};

}  // namespace corral::http
