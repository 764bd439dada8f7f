// Connection: one HTTP/1.1 client connection. It only admits, parses and writes: the request goes
// through the parser, the admission baseline and the Site; the Response description comes back,
// becomes a ResponsePlan (response_plan.h) and is written by the HTTP/1.1 writer (h1_writer.h).
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
// head is parsed; the connection is then the request's BodyStream: it reads the socket only while
// the consumer takes pieces (one read, 16 KiB, at a time), and a response that ends before the
// body did closes the connection.
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
#include "http/file_response.h"
#include "http/parser.h"
#include "http/request.h"
#include "http/response.h"
#include "http/response_plan.h"

namespace corral::http {

class Server;
class Site;

class Connection final : public core::IoHandler,
                         private StreamWriter,
                         private Responder,
                         private BodyStream,
                         private BodyRules {
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
  void write_response(Response& response);  // a ResponsePlan, written by h1_writer.h
  PlanContext plan_context() const;
  void respond_error(int status, std::string_view reason);
  void finish_request();
  void flush();
  bool send_file_data();
  void update_interest();
  void arm_read_timer(ReadTimer kind, uint32_t ms);
  void on_read_timer();
  void start_linger();
  void hand_over();  // after a 101: the socket goes to the upgrade handler
  void access_log(int status, uint64_t bytes);
  void keep_log_fields();  // copies of what the access log needs, before the response goes async
  void count_response_head();  // /metrics (http/metrics.h)
  void abort_stream();
  // StreamWriter
  bool write(std::string_view data) override;
  void end() override;
  void abort() override;
  size_t buffered() const override { return out_.size(); }
  // Responder
  void respond(Response response) override;
  // BodyRules: the route's, asked by the parser for a head with a body.
  BodyRule body_rule(Request& req) override;
  // BodyStream
  void read(BodyConsumer* consumer) override;
  void resume() override;
  std::optional<uint64_t> length() const override;
  uint64_t delivered() const override { return body_delivered_; }
  // A streamed body: the route runs at the head; pieces go to the consumer as they come.
  void start_body_stream();
  void schedule_body_pump();
  void pump_body();
  // The body cannot be complete: the consumer hears why; the client gets `status` if no response
  // head went out yet, else the connection closes.
  void fail_body(int status, std::string_view why);
  // Tells a consumer still attached that its body will not be complete (no answer is written).
  void abandon_body(std::string_view why);

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
  char echo_seq_[24];  // behind corral: the request's Corral-Seq, echoed by its response
  uint8_t echo_seq_len_ = 0;
  RequestParser parser_;
  Request req_;
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
  bool in_request_ = false;           // counted in the Server's requests in flight
  std::shared_ptr<const Site> site_;  // the site of the request in flight
  std::string admitted_host_;

  ResponsePlan plan_;  // write_response's, kept between responses (see ResponsePlan's cost)

  // The response in progress (files and streams).
  ResolvedFile file_;
  size_t file_part_ = 0;      // multipart: the part being sent
  uint64_t file_offset_ = 0;  // next byte of the current range
  uint64_t file_left_ = 0;    // bytes left in the current range
  bool file_active_ = false;  // a body is being sent after out_: a file, or big_body_
  std::string big_body_;      // a large string body, sent in place
  size_t big_off_ = 0;
  std::unique_ptr<StreamProducer> producer_;
  std::unique_ptr<UpgradeHandler> upgrade_;
  std::unique_ptr<DeferredProducer>
      deferred_;  // waiting for respond()  // set by a 101 response until hand_over()
  bool stream_chunked_ = false;
  bool stream_ended_ = false;
  bool stream_wants_writable_ = false;
  uint64_t body_bytes_ = 0;  // for the access log
  int status_ = 0;
  uint64_t started_ms_ = 0;
  uint64_t started_us_ = 0;  // EventLoop::now_us() at the request's first byte (/metrics)
  // A streamed request body (body_stream.h).
  enum class BodyState : uint8_t { kNone, kOpen };
  BodyState body_state_ = BodyState::kNone;  // kOpen: the route runs, its body is still coming
  BodyConsumer* body_consumer_ = nullptr;
  uint64_t body_delivered_ = 0;
  bool body_paused_ = false;          // on_body_data returned false: no more until resume()
  bool body_resumed_ = false;         // resume() came while on_body_data ran
  bool body_in_callback_ = false;     // on_body_data runs
  bool body_pump_scheduled_ = false;  // a pump_body() is deferred
  bool continue_sent_ = false;        // the 100 Continue of this request
  bool head_out_ = false;             // this request's response head is written
  bool peer_shut_ = false;            // EPOLLRDHUP seen while a body streams: read on to its EOF
  std::string log_method_;            // copies for the access log of an asynchronous response
  std::string log_target_;
  std::string log_referer_, log_agent_;  // combined format only
};

}  // namespace corral::http
