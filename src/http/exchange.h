// Exchange: one request's life, the same for every protocol. It runs admission and the Site,
// turns the route's Response into a ResponsePlan (response_plan.h) and drives the body's source —
// bytes, a file (ranges, multipart), a StreamProducer with backpressure, a DeferredProducer, an
// upgrade — and, for a route that streams its request body, the BodyStream its consumer reads;
// then the access log line and the metrics. It never touches a socket: each protocol carries it
// through an ExchangeStream (send the head, data, a file; end, reset; tell when writable, when
// the peer is gone), the way Envoy's ActiveStream talks to its codec. HTTP/1.1 (connection.h:
// the connection is the stream of its one exchange at a time) and HTTP/3 (quic/h3_connection.h:
// each request stream) implement it; docs/http.md says how HTTP/2 fits.
//
// Lifetime: owned by its stream's owner and reusable (HTTP/1.1 keeps one per connection: no
// allocation per request). begin() -> dispatch() (or respond_error()) -> the response ->
// complete(); peer_gone() when the peer left first. Single-threaded: the loop's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "http/admission.h"
#include "http/body_stream.h"
#include "http/file_response.h"
#include "http/request.h"
#include "http/response.h"
#include "http/response_plan.h"

namespace corral::core {
class EventLoop;
}

namespace corral::http {

class Server;
class Site;

// Where a file body stands: the segments of a ResolvedFile (the whole file, one range, or the
// parts of a multipart/byteranges body with their heads and the closing delimiter), taken in
// order as the protocol sends them (sendfile, pread into its queue, a data provider). No
// allocation: the segments are walked in place.
class FileCursor {
 public:
  void start(ResolvedFile&& file);
  bool active() const { return active_; }
  // The current piece while active(): framing text (`text` non-empty; what is left of it) or
  // `length` bytes of fd() from `offset`.
  FileSegment current() const;
  // `n` bytes of the current piece went out (at most its length).
  void advance(uint64_t n);
  int fd() const { return file_.fd.get(); }
  const ResolvedFile& file() const { return file_; }
  void clear();

 private:
  void enter_part();
  ResolvedFile file_;
  size_t part_ = 0;       // multipart: the part being sent; parts.size(): the closing delimiter
  bool in_text_ = false;  // sending a part's head (or the delimiter), text_off_ into it
  size_t text_off_ = 0;
  uint64_t offset_ = 0;  // the file range being sent
  uint64_t left_ = 0;
  bool active_ = false;
};

// A protocol's side of one exchange: an HTTP/1.1 connection, an HTTP/3 or HTTP/2 stream.
//
// The response goes out as send_head(), then by the plan's body kind: nothing more (kNone,
// kBytes: the protocol takes plan.bytes with the head, copying them or take_bytes()), a file
// (send_file: the protocol takes the cursor's pieces as the peer accepts them), data
// (send_data... then end_stream() or reset_stream()), or, for a 101, upgrade(). The protocol
// calls Exchange::complete() once the response is handed over (or the stream is gone), and
// Exchange::writable() when its queue drained after send_data() returned false.
class ExchangeStream {
 public:
  // HTTP/1.1: whether the connection may stay open after this response.
  virtual bool keep_alive() const { return true; }
  // The head of the final response (or a 101). `plan` is valid during the call only: fields
  // are serialized (or copied) before it returns.
  virtual void send_head(ResponsePlan& plan) = 0;
  // A file body after its head; the cursor is the exchange's, valid until complete().
  virtual void send_file(FileCursor& file) = 0;
  // Stream data (a copy is queued). False once the queue passes the high-water mark.
  virtual bool send_data(std::string_view data) = 0;
  virtual void end_stream() = 0;
  // The body cannot be completed: the peer must see it cut (HTTP/1.1: no last chunk, then
  // close; HTTP/2: RST_STREAM; HTTP/3: the stream reset), never complete.
  virtual void reset_stream() = 0;
  virtual size_t buffered() const = 0;
  // Whether a 101 may be sent here (false: the upgrade is refused with 501).
  virtual bool can_upgrade() const { return false; }
  virtual void upgrade(std::unique_ptr<UpgradeHandler> handler) { (void)handler; }
  // A deferred response was written from outside the protocol's own calls: send it.
  virtual void responded_later() = 0;
  // The request passed admission (HTTP/1.1 remembers the host for a policy change).
  virtual void admitted(const Request& req) { (void)req; }
  // A streamed request body (body_stream.h): the consumer asked for (more of) it; it let go
  // (read(nullptr)); it will never get the rest (the protocol stops the body: HTTP/1.1 closes
  // after the response).
  virtual void request_body_wanted() {}
  virtual void request_body_detached() {}
  virtual void request_body_abandoned() {}
  virtual std::optional<uint64_t> request_body_length() const { return std::nullopt; }

 protected:
  ~ExchangeStream() = default;
};

class Exchange final : private StreamWriter, private Responder, private BodyStream {
 public:
  // `peer` outlives the exchange (its connection's).
  Exchange(Server& server, ExchangeStream& stream, Protocol protocol, const Peer& peer);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  Request& request() { return req_; }
  // The request's first byte: timed and counted in flight. A multiplexed protocol starts the
  // clock when the stream opens and counts the request once it is complete (count_in_flight()).
  void begin() {
    start_clock();
    count_in_flight();
  }
  void start_clock();
  void count_in_flight();
  bool begun() const { return in_request_; }

  struct Dispatch {
    enum Kind : uint8_t { kHandled, kParked, kRefused } kind = kHandled;
    int status = 0;  // kRefused: answer it with respond_error()
    std::string_view reason;
  };
  // Admission, then the Site: the response is under way (kHandled), no site is published yet
  // (kParked: run_site() once one is), or admission refused it.
  Dispatch dispatch();
  void run_site();
  // An error answered by the server itself (a bare status; logged as request_refused).
  void respond_error(int status, std::string_view reason);
  // The response was handed over, or the stream is gone: the access log and the metrics, and
  // the exchange is ready for the next request.
  void complete();
  // The peer is gone or the server closes: producers and a body consumer are told, nothing is
  // written any more.
  void peer_gone();
  // No longer counted in flight, without a log line (the connection closed under it).
  void release();

  // The protocol's queue drained below its low-water mark.
  void writable();
  // A file body was sent whole.
  void file_done();
  // Copies of what the access log needs, for a response that outlives the request's bytes.
  void keep_log_fields();

  bool head_out() const { return head_out_; }
  bool producing() const { return producer_ != nullptr; }
  bool wants_writable() const { return producer_ && wants_writable_; }
  bool waiting() const { return producer_ || deferred_; }  // a stream or deferred in progress
  int status() const { return status_; }

  // A streamed request body (body_stream.h): the protocol opens it, hands pieces to the
  // consumer while body_flowing(), and ends or abandons it.
  void open_body();
  bool body_open() const { return body_open_; }
  bool body_flowing() const { return body_open_ && consumer_ && !body_paused_; }
  bool body_consumer() const { return consumer_ != nullptr; }
  void deliver_body(std::string_view piece);
  void end_body();
  // Tells a consumer still attached that its body will not be complete; false: none was open.
  bool abandon_body(std::string_view why);

 private:
  void handle();
  void write_response(Response& r);
  PlanContext plan_context() const;
  void count_response_head();
  void access_log();
  // StreamWriter
  bool write(std::string_view data) override;
  void end() override;
  void abort() override;
  size_t buffered() const override { return stream_.buffered(); }
  // Responder
  void respond(Response response) override;
  // BodyStream
  void read(BodyConsumer* consumer) override;
  void resume() override;
  std::optional<uint64_t> length() const override { return stream_.request_body_length(); }
  uint64_t delivered() const override { return body_delivered_; }

  Server& server_;
  core::EventLoop& loop_;
  ExchangeStream& stream_;
  const Protocol protocol_;
  const uint8_t metrics_proto_;  // ProcessMetrics::Proto
  const Peer& peer_;
  Request req_;
  std::shared_ptr<const Site> site_;  // the site of the request in flight
  ResponsePlan plan_;                 // kept between responses (see ResponsePlan's cost)
  FileCursor file_;
  std::unique_ptr<StreamProducer> producer_;
  std::unique_ptr<DeferredProducer> deferred_;  // waiting for respond()
  bool in_request_ = false;                     // counted in the Server's requests in flight
  bool head_out_ = false;                       // this request's response head is written
  bool stream_ended_ = false;                   // end() or abort() of the stream producer
  bool wants_writable_ = false;                 // write() returned false
  uint8_t echo_seq_len_ = 0;
  char echo_seq_[24];  // behind corral: the request's Corral-Seq, echoed by its response
  int status_ = 0;
  uint64_t body_bytes_ = 0;  // for the access log
  uint64_t started_ms_ = 0;
  uint64_t started_us_ = 0;  // EventLoop::now_us() at the request's first byte (/metrics)
  std::string log_method_;   // copies for the access log of an asynchronous response
  std::string log_target_;
  std::string log_referer_, log_agent_;  // combined format only
  // A streamed request body.
  bool body_open_ = false;         // the route runs, its body is still coming
  bool body_paused_ = false;       // on_body_data returned false: no more until resume()
  bool body_resumed_ = false;      // resume() came while on_body_data ran
  bool body_in_callback_ = false;  // on_body_data runs
  BodyConsumer* consumer_ = nullptr;
  uint64_t body_delivered_ = 0;
};

}  // namespace corral::http
