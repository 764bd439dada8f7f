#include "proxy/proxy.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/event_loop.h"
#include "core/timer_wheel.h"
#include "http/body_stream.h"
#include "http/metrics.h"
#include "proxy/fields.h"
#include "proxy/relay.h"
#include "proxy/response_reader.h"
#include "proxy/upstream_connection.h"

namespace corral::proxy {

using http::iequals;
using http::Method;
using http::Request;
using http::Response;

namespace {
class Call;
}  // namespace

// What an UpstreamAnswer holds: the call it answers, unlinked when the call goes.
struct UpstreamAnswer::Waiting {
  Call* call;
};

namespace {

bool corral_header(std::string_view name) {
  return name.size() >= 7 && iequals(name.substr(0, 7), "corral-");
}

// An Upgrade field, and "upgrade" among the Connection field's options (a whole token).
bool is_upgrade(const Request& req) {
  return req.header("upgrade") && req.headers.has_token("connection", "upgrade");
}

// A request that may be sent again when its upstream went away without a byte of an answer
// (RFC 9110 §9.2.2; PUT and DELETE are idempotent too, but a worker's handler for them may not
// be written so: only the safe methods).
bool idempotent(const Request& req) {
  return req.method == Method::kGet || req.method == Method::kHead ||
         req.method == Method::kOptions;
}

// A request that may wait behind another on a pipelined upstream connection, and be sent again
// if it was held there: GET or HEAD, no body, no upgrade.
bool pipelinable(const Request& req) {
  return (req.method == Method::kGet || req.method == Method::kHead) && req.body.empty() &&
         !req.body_stream && !is_upgrade(req);
}

std::string prepare_request(const Request& req, const ProxyOptions& options) {
  std::string r;
  r.reserve(256 + req.target.size() + options.extra_headers.size() + req.body.size());
  std::string_view target = options.target.empty() ? req.target : options.target;
  r.append(req.method_name).append(" ").append(target).append(" HTTP/1.1\r\n");
  // The upstream is on a Unix socket reached only through us: it sees Host: localhost (its own
  // admission baseline admits that) and the client's Host in Corral-Host.
  r.append("Host: localhost\r\n");
  if (!req.host.empty()) r.append("Corral-Host: ").append(req.host).append("\r\n");
  // Only when it is not the default: every byte here is on every proxied request (one header
  // more on each made the server process's CPU per proxied request 1.05x, bench/workers.sh).
  if (req.scheme == "https") r.append("Corral-Scheme: https\r\n");
  std::string_view trace = req.traceparent();
  bool client_trace = !trace.empty() && req.header("traceparent") == trace;
  // Fields the client's Connection names are hop-by-hop for its request (RFC 9110 §7.6.1).
  bool named = false;
  for (const auto& h : req.headers)
    if (h.name.size() == 10 && iequals(h.name, "connection") && connection_names_fields(h.value))
      named = true;
  for (const auto& h : req.headers) {
    // Expect: the front has the whole body before the route runs (it answered the client's
    // 100-continue itself, as nginx does), and the body goes with the head: no expectation is
    // left for the upstream to meet.
    if (hop_by_hop(h.name) || corral_header(h.name) || iequals(h.name, "content-length") ||
        iequals(h.name, "host") || iequals(h.name, "expect") ||
        (named && req.headers.has_token("connection", h.name)))
      continue;
    // The request's own traceparent goes below (the client's when it was valid); a client's
    // tracestate goes with the client's trace only (W3C Trace Context §3.3).
    if (!trace.empty() && h.name.size() == 11 && iequals(h.name, "traceparent")) continue;
    if (!trace.empty() && h.name.size() == 10 && iequals(h.name, "tracestate") && !client_trace)
      continue;
    r.append(h.name).append(": ").append(h.value).append("\r\n");
  }
  if (!trace.empty()) r.append("traceparent: ").append(trace).append("\r\n");
  r.append(options.extra_headers);
  if (req.body_stream) {
    // Streamed: the body follows the head as the client sends it, framed as the client framed
    // it (a chunked body is re-chunked piece by piece; its trailers were dropped).
    if (auto length = req.body_stream->length()) {
      r.append("Content-Length: ").append(std::to_string(*length)).append("\r\n");
    } else {
      r.append("Transfer-Encoding: chunked\r\n");
    }
  } else if (!req.body.empty() || req.method == Method::kPost || req.method == Method::kPut ||
             req.method == Method::kPatch) {
    r.append("Content-Length: ").append(std::to_string(req.body.size())).append("\r\n");
  }
  if (is_upgrade(req)) {
    // The one hop-by-hop pair that must cross: the upstream decides whether to switch.
    r.append("Upgrade: ").append(*req.header("upgrade")).append("\r\nConnection: Upgrade\r\n\r\n");
  } else if (!options.pool) {
    r.append("Connection: close\r\n\r\n");
  } else {
    r.append("\r\n");  // HTTP/1.1: keep-alive
  }
  r.append(req.body);
  return r;
}

class Call;
class Body;

// One proxied request and its response. Owned by its Call until it is sent, then by the queue of
// the connection it is on, and by its Call again while a retry waits for the next round. The
// client's side (the Call until the head is answered, then the Body that carries the response's
// body) and the exchange point at each other; whichever goes first unlinks itself.
class ProxiedExchange final : public Exchange, private http::BodyConsumer, private RoomWaiter {
 public:
  ProxiedExchange(core::EventLoop& loop, std::string request, uint32_t timeout_ms, bool head,
                  bool upgrade_requested, UpstreamPool* pool, bool may_pipeline,
                  http::BodyStream* body_stream)
      : loop_(loop),
        body_stream_(body_stream),
        body_chunked_(body_stream && !body_stream->length()),
        options_pool_(upgrade_requested ? nullptr : pool),
        pool_(options_pool_),
        timer_(loop.timers(), [this] { timed_out(); }),
        timeout_ms_(timeout_ms) {
    this->request = std::move(request);
    head_request = head;
    upgrade = upgrade_requested;
    pipelinable = may_pipeline && !upgrade_requested && !body_stream;
    body_open = body_stream != nullptr;
  }
  ~ProxiedExchange() override;

  core::EventLoop& loop() { return loop_; }
  void set_path(std::string path) { path_ = std::move(path); }
  // The caller's hook for a 504 (ProxyOptions::on_timeout) and its name for the upstream.
  void set_caller(ProxyOptions& options) {
    on_timeout_ = std::move(options.on_timeout);
    on_busy_ = std::move(options.on_busy);
    label_ = std::move(options.label);
  }
  const std::string& label() const { return label_; }
  // Before it is sent again: a fresh connection of its own (the one it was on had died under
  // it), or, after finding the upstream again, as new.
  void reset(bool fresh_connection);
  // The client is gone. Still behind another request on a connection: it stays and its response
  // is read to nothing; the first on one closes it (those behind are sent again elsewhere).
  void abort();
  void attach_writer(http::StreamWriter* w);
  void resume() {
    if (conn) conn->resume_reading();
  }
  void unlink_call() { call_ = nullptr; }
  // On a connection now: a streamed request body starts (or goes on) to it.
  void read_body() {
    if (body_stream_ && conn) body_stream_->read(this);
  }
  void unlink_body() { body_ = nullptr; }

  // Exchange
  void on_head(ResponseHead& head) override;
  void on_body(std::string_view data) override;
  void on_read(bool complete) override;
  void on_end() override;
  void on_switch(core::UniqueFd upstream, std::string leftover) override;
  void lost(std::unique_ptr<Exchange> self, const Loss& loss) override;
  void on_drained() override {
    if (body_stream_) body_stream_->resume();
  }

  friend void dispatch(std::unique_ptr<ProxiedExchange> ex);
  friend class Call;

 private:
  // Off any connection (`self`): sent again, or answered `status`.
  void fail(std::unique_ptr<Exchange> self, int status, std::string_view why, bool retryable);
  void timed_out();
  void answer_head();
  void respond(Response r);
  void respond_error(int status, std::string_view why);
  // The upstream's accept queue stayed full: 503 with Retry-After (ProxyOptions::on_busy).
  void respond_busy();
  void finish_body();
  // The body cannot be completed (the upstream cut it, or sent what is no body): the client
  // sees it cut (http::StreamWriter::abort), never a complete message.
  void cut_body();
  // A connection with room, after wait_for_room (RoomWaiter): the request goes on it.
  void on_room(std::unique_ptr<UpstreamConnection> c, bool reused_connection) override;
  void on_unreachable(std::string_view why) override;
  // BodyConsumer: the client's streamed request body, piped to the connection.
  bool on_body_data(std::string_view piece) override;
  void on_body_end() override;
  void on_body_abort(std::string_view why) override;
  // The body stops coming to this exchange (it left its connection, or is done with it).
  void detach_body() {
    if (auto* b = std::exchange(body_stream_, nullptr)) b->read(nullptr);
  }

  core::EventLoop& loop_;
  http::BodyStream* body_stream_;  // a streamed request body, until its end or abort
  bool body_chunked_;
  bool body_taken_ = false;  // a piece was sent: the request can never be sent again
  std::string path_;
  UpstreamPool* options_pool_;
  UpstreamPool* pool_;  // null once it is retried on a fresh connection of its own
  core::Timer timer_;   // until the response head
  uint32_t timeout_ms_;
  std::function<Response(std::string_view, std::string_view)> on_timeout_;  // instead of a 504
  std::function<Response(std::string_view, std::string_view)> on_busy_;     // instead of a 503
  std::string label_;                                                       // ProxyOptions::label
  Call* call_ = nullptr;  // the client's side until the head is answered
  Body* body_ = nullptr;  // then the stream that carries the body
  http::StreamWriter* writer_ = nullptr;
  std::string pending_body_;  // before the writer is there: bounded by one read's worth
  Response pending_head_;     // built, not answered yet (head_waits_)
  std::string content_type_;
  std::optional<uint64_t> length_;       // the body's, from Content-Length
  Response::HeaderList switch_headers_;  // of a 101
  bool head_waits_ = false;              // a body of known length may be whole after this read
  bool head_seen_ = false;
  bool complete_ = false;
  bool cut_ = false;           // the body was cut before its writer came: cut it once it does
  bool waiting_room_ = false;  // in its pool's wait_for_room
};

// Sends `ex` (defined after Call, which holds an exchange waiting for room).
void dispatch(std::unique_ptr<ProxiedExchange> ex);

// The route's deferred response: starts the exchange, finds the upstream first (proxy_found),
// and holds the exchange while a retry waits for the next loop round.
class Call final : public http::DeferredProducer {
 public:
  Call(std::unique_ptr<ProxiedExchange> ex, UpstreamFinder find, bool idempotent,
       http::Request::Upstream* upstream = nullptr)
      : ex_(ex.get()),
        waiting_(std::move(ex)),
        find_(std::move(find)),
        upstream_(upstream),
        idempotent_(idempotent) {
    ex_->call_ = this;
  }
  ~Call() override {
    if (ex_) ex_->unlink_call();
    if (pending_) pending_->call = nullptr;
  }
  void start(http::Responder& r) override {
    responder = &r;
    if (find_) return attempt();
    dispatch(std::move(waiting_));
  }
  void on_abort() override {
    responder = nullptr;
    if (ex_) ex_->abort();
  }

  // An idempotent request, or one the upstream never read (the connect failed, or it closed
  // with the request unread), is tried once more after finding the upstream again (the finder
  // then starts a new worker).
  bool may_find_again(bool unread) const { return find_ && !retried_ && (idempotent_ || unread); }
  bool idempotent() const { return idempotent_; }
  // `ex` goes out again next round: on a fresh connection, or after finding the upstream again.
  void again(std::unique_ptr<ProxiedExchange> ex, bool find);
  void unlink_exchange() { ex_ = nullptr; }
  // Holds `ex` while it waits for room in its upstream's accept queue; take_waiting gives it back.
  void hold(std::unique_ptr<ProxiedExchange> ex) { waiting_ = std::move(ex); }
  std::unique_ptr<ProxiedExchange> take_waiting() { return std::move(waiting_); }
  // The finder's answer (UpstreamAnswer).
  void found(std::string path, std::optional<Response> instead, UpstreamProcess process);

  http::Responder* responder = nullptr;  // until the response starts

 private:
  // What a step that may come after the call is gone (the finder's answer, a retry next round)
  // finds of it. shared: the finder holds it as long as it likes.
  using Pending = UpstreamAnswer::Waiting;
  void attempt();
  std::shared_ptr<Pending>& pending();

  ProxiedExchange* ex_;                       // wherever it is; null once it is gone
  std::unique_ptr<ProxiedExchange> waiting_;  // while the call holds it
  UpstreamFinder find_;
  http::Request::Upstream* upstream_;  // the route's request's (proxy_found); valid while responder
  std::shared_ptr<Pending> pending_;
  bool idempotent_;
  bool retried_ = false;
};

// Sends `ex`: pipelined behind the requests of this round on a pooled connection, or on an idle
// pooled one, or on a new one.
void dispatch(std::unique_ptr<ProxiedExchange> ex) {
  ex->timer_.arm_after(ex->timeout_ms_);
  UpstreamPool* pool = ex->pool_;
  if (pool && ex->pipelinable) {
    if (UpstreamConnection* c = pool->joinable(ex->path_)) {
      ex->reused = true;  // a connection that fails before answering it: sent again (fail)
      ++pool->stats().pipelined;
      c->push(std::move(ex));
      return;
    }
  }
  std::unique_ptr<UpstreamConnection> c;
  if (pool) c = pool->take(ex->path_);
  ex->reused = c != nullptr;
  if (!c) {
    auto opened = UpstreamConnection::open(ex->loop_, ex->path_, pool);
    if (!opened.conn) {
      ex->never_sent = opened.unreachable;
      ProxiedExchange* e = ex.get();
      if (opened.busy && pool && e->call_) {
        // The upstream's accept queue is full: the request waits for room, in order, within its
        // response timeout (already running), held by its call meanwhile.
        e->waiting_room_ = true;
        pool->wait_for_room(e->path_, *e);
        return e->call_->hold(std::move(ex));
      }
      if (opened.busy) {
        e->discard = true;
        e->respond_busy();
        return e->loop_.destroy_later(std::move(ex));
      }
      return e->fail(std::move(ex), 502, opened.why, opened.unreachable);
    }
    c = std::move(opened.conn);
  }
  ProxiedExchange* e = ex.get();
  c.release()->push(std::move(ex));  // a busy connection owns itself (upstream_connection.h)
  e->read_body();
}

}  // namespace

void UpstreamAnswer::operator()(std::string path, std::optional<Response> instead,
                                UpstreamProcess process) const {
  if (waiting_ && waiting_->call)
    waiting_->call->found(std::move(path), std::move(instead), process);
}

namespace {

std::shared_ptr<Call::Pending>& Call::pending() {
  if (!pending_) pending_ = std::make_shared<Pending>(Pending{this});
  return pending_;
}

void Call::attempt() {
  find_(waiting_->label(), UpstreamAnswer(pending()), retried_);
}

void Call::found(std::string path, std::optional<Response> instead, UpstreamProcess process) {
  if (!responder || !waiting_) return;
  if (upstream_ && !instead) {
    // Found again after a failure: the process that answers is the last one found; the request
    // stays cold once it waited for a start.
    upstream_->worker_pid = process.pid;
    upstream_->cold = upstream_->cold || process.cold;
  }
  if (instead) {
    // The exchange is never sent: its body (held for it while it waited) is not read.
    waiting_->detach_body();
    auto* r = responder;
    responder = nullptr;
    r->respond(std::move(*instead));
    return;
  }
  waiting_->set_path(std::move(path));
  dispatch(std::move(waiting_));
}

void Call::again(std::unique_ptr<ProxiedExchange> ex, bool find) {
  ex->reset(!find);
  waiting_ = std::move(ex);
  if (find) retried_ = true;
  waiting_->loop().defer([p = pending(), find] {
    Call* call = p->call;
    if (!call || !call->responder || !call->waiting_) return;
    if (find) return call->attempt();
    dispatch(std::move(call->waiting_));
  });
}

// The body of a streamed response (chunked, until close, or not whole in the head's read).
class Body final : public http::StreamProducer {
 public:
  explicit Body(ProxiedExchange* ex) : ex_(ex) {}
  ~Body() override { drop(); }
  void on_start(http::StreamWriter& w) override {
    if (ex_) ex_->attach_writer(&w);
  }
  void on_writable(http::StreamWriter&) override {
    if (ex_) ex_->resume();
  }
  void on_abort() override { drop(); }
  void unlink_exchange() { ex_ = nullptr; }

 private:
  void drop() {
    if (!ex_) return;
    auto* ex = ex_;
    ex_ = nullptr;
    ex->unlink_body();
    ex->abort();
  }
  ProxiedExchange* ex_;
};

ProxiedExchange::~ProxiedExchange() {
  if (waiting_room_ && pool_) pool_->stop_waiting(*this);
  detach_body();
  if (call_) call_->unlink_exchange();
  if (body_) body_->unlink_exchange();
}

void ProxiedExchange::reset(bool fresh_connection) {
  timer_.cancel();
  reused = got_bytes = unread = wrote = false;
  if (fresh_connection) {
    pool_ = nullptr;  // a pooled connection the upstream had closed: a fresh one, not pooled
  } else {
    pool_ = options_pool_;
    never_sent = discard = head_seen_ = false;
  }
}

void ProxiedExchange::abort() {
  if (call_) {
    call_->unlink_exchange();
    call_ = nullptr;
  }
  if (body_) {
    body_->unlink_exchange();
    body_ = nullptr;
  }
  writer_ = nullptr;
  discard = true;
  pending_body_.clear();
  timer_.cancel();
  if (std::exchange(waiting_room_, false) && pool_) pool_->stop_waiting(*this);
  detach_body();
  // The first on its connection: closed, so an upstream reading a streamed body sees it cut.
  if (conn) conn->abandon(*this, Loss{});
}

bool ProxiedExchange::on_body_data(std::string_view piece) {
  body_taken_ = true;
  // The response timeout runs from the last body byte the upstream took, not from the start:
  // a long upload is not a slow upstream.
  if (!head_seen_) timer_.arm_after(timeout_ms_);
  if (!conn) return true;  // nowhere to go (it is being lost): dropped
  return conn->send_body(piece, body_chunked_);
}

void ProxiedExchange::on_body_end() {
  body_stream_ = nullptr;
  body_open = false;
  if (!head_seen_) timer_.arm_after(timeout_ms_);
  if (conn && body_chunked_) conn->end_chunked_body();
}

void ProxiedExchange::on_body_abort(std::string_view) {
  body_stream_ = nullptr;
  // The client left (or its body was refused): the upstream must not take a cut body for a
  // whole one. Its connection is closed, never pooled.
  abort();
}

void ProxiedExchange::attach_writer(http::StreamWriter* w) {
  writer_ = w;
  if (!w) return abort();  // the client is gone
  if (!pending_body_.empty()) {
    std::string pending = std::move(pending_body_);
    pending_body_.clear();
    if (!writer_->write(pending) && conn) conn->pause_reading();
  }
  if (cut_) return cut_body();
  if (complete_) finish_body();
}

void ProxiedExchange::timed_out() {
  if (waiting_room_) {
    // Its upstream never had room for it: it was never sent. 503, come back later.
    waiting_room_ = false;
    if (pool_) pool_->stop_waiting(*this);
    discard = true;
    detach_body();
    return respond_busy();  // its call holds it, and goes with it
  }
  // The first on its connection closes it (lost answers); one behind answers here and reads
  // its response to nothing when it comes.
  if (conn && conn->abandon(*this, Loss{504, "upstream response timeout", false})) return;
  discard = true;
  respond_error(504, "upstream response timeout");
}

void ProxiedExchange::lost(std::unique_ptr<Exchange> self, const Loss& loss) {
  if (body_taken_) {
    detach_body();  // it cannot be sent again
  } else if (body_stream_) {
    body_stream_->read(nullptr);  // nothing comes while it waits to be sent again
  }
  if (loss.status == 0 || discard) {
    detach_body();
    // Cut short by the upstream (or the client is gone, and there is no writer): the client
    // must see the body cut, never a complete message.
    if (!discard) respond_error(502, "upstream response cut short");
    loop_.destroy_later(std::move(self));
    return;
  }
  fail(std::move(self), loss.status, loss.why, loss.retryable);
}

void ProxiedExchange::fail(std::unique_ptr<Exchange> self, int status, std::string_view why,
                           bool retryable) {
  timer_.cancel();
  // A streamed body that began to leave cannot be replayed.
  bool waiting = retryable && !body_taken_ && !head_seen_ && call_ && call_->responder;
  bool unread_request = never_sent || unread;
  if (waiting && reused && !got_bytes && (call_->idempotent() || unread_request)) {
    // A pooled connection the upstream had closed (or the one it was pipelined on failed): the
    // request never got an answer. Again, on a fresh connection: an idempotent one, or any
    // other the upstream provably did not read (RFC 9112 §9.3.1: a POST it may have acted on
    // is answered 502, not repeated).
    return call_->again(
        std::unique_ptr<ProxiedExchange>(static_cast<ProxiedExchange*>(self.release())), false);
  }
  if (waiting && call_->may_find_again(unread_request)) {
    return call_->again(
        std::unique_ptr<ProxiedExchange>(static_cast<ProxiedExchange*>(self.release())), true);
  }
  discard = true;
  detach_body();
  respond_error(status, why);
  loop_.destroy_later(std::move(self));
}

void ProxiedExchange::on_head(ResponseHead& head) {
  if (head.status == 101) {  // a requested switch: answered with its socket (on_switch)
    switch_headers_ = std::move(head.headers);
    return;
  }
  head_seen_ = true;
  timer_.cancel();
  Response r;
  r.status = head.status;
  // Filtered while read already, except for an upgrade request, which kept them all for a 101
  // that did not come; and the fields the response's Connection names (RFC 9110 §7.6.1).
  bool named = !head.connection.empty() && connection_names_fields(head.connection);
  for (auto& [k, v] : head.headers)
    if (!dropped_response_header(k) && !(named && connection_lists(head.connection, k)))
      r.headers.emplace_back(std::move(k), std::move(v));
  head.headers.clear();
  bool no_body = head_request || r.status == 204 || r.status == 304;
  if (no_body) {
    r.set_content_type(std::move(head.content_type));
    if (head_request && head.content_length)
      r.header("Content-Length", std::to_string(*head.content_length));
    return respond(std::move(r));
  }
  pending_head_ = std::move(r);
  content_type_ = std::move(head.content_type);
  if (head.content_length) {
    length_ = head.content_length;
    // A body of known length often came in the same read as the head: see after this read
    // (on_read) whether it is whole, and answer it as plain bytes if so.
    head_waits_ = true;
    return;
  }
  answer_head();  // chunked or until close: streamed
}

void ProxiedExchange::on_body(std::string_view data) {
  if (discard) return;
  if (writer_) {
    if (!writer_->write(data) && conn) conn->pause_reading();
  } else {
    pending_body_.append(data);  // before on_start: kept, bounded by one read's worth
  }
}

void ProxiedExchange::on_read(bool complete) {
  complete_ = complete;
  if (head_waits_) answer_head();
}

void ProxiedExchange::on_end() {
  detach_body();  // a response before the body's end: the client's connection closes after it
  complete_ = true;
  if (writer_) finish_body();
}

// The head is in; the body is whole (one response) or still coming (a stream that carries it,
// with backpressure).
void ProxiedExchange::answer_head() {
  head_waits_ = false;
  Response r = std::move(pending_head_);
  if (discard) return;
  if (complete_) {
    Response whole = Response::bytes(std::move(pending_body_), {}, r.status);
    if (content_type_.empty()) {
      whole.set_content_type_static("application/octet-stream");
    } else {
      whole.set_content_type(std::move(content_type_));
    }
    whole.headers = std::move(r.headers);
    return respond(std::move(whole));
  }
  if (conn) conn->rescue_behind();  // a stream: nothing pipelined waits for its end
  auto body = std::make_unique<Body>(this);
  body_ = body.get();
  std::string_view type =
      content_type_.empty() ? std::string_view("application/octet-stream") : content_type_;
  auto stream = Response::stream(std::move(body), type, length_);
  stream.status = r.status;
  stream.headers = std::move(r.headers);
  respond(std::move(stream));
}

// 101 from the upstream: the client gets the same 101 and both sockets are relayed.
void ProxiedExchange::on_switch(core::UniqueFd upstream, std::string leftover) {
  timer_.cancel();
  head_seen_ = true;
  Response r =
      Response::upgrade(std::make_unique<RelayUpgrade>(std::move(upstream), std::move(leftover)));
  for (auto& [k, v] : switch_headers_) {
    if (iequals(k, "date") || iequals(k, "server") || iequals(k, "content-length")) continue;
    r.headers.emplace_back(std::move(k), std::move(v));
  }
  respond(std::move(r));
}

void ProxiedExchange::respond(Response r) {
  if (!call_ || !call_->responder) return;
  auto* responder = call_->responder;
  call_->responder = nullptr;
  call_->unlink_exchange();  // the call is done (the connection destroys it after the round)
  call_ = nullptr;
  responder->respond(std::move(r));
}

void ProxiedExchange::respond_error(int status, std::string_view why) {
  // /metrics (http/metrics.h): the reason by what the client gets.
  http::add(http::metrics().proxy_errors[!(call_ && call_->responder) ? http::ProcessMetrics::kCut
                                         : status == 504 ? http::ProcessMetrics::kTimeout
                                         : never_sent    ? http::ProcessMetrics::kUnreachable
                                                         : http::ProcessMetrics::kBroken]);
  if (call_ && call_->responder) {
    if (status == 504 && on_timeout_) {
      std::string_view method(request);  // the request line's first word
      method = method.substr(0, method.find(' '));
      return respond(std::exchange(on_timeout_, nullptr)(method, label_));
    }
    auto r = Response::status_only(status);
    r.header("Corral-Proxy-Error", std::string(why));
    respond(std::move(r));
  } else {
    cut_body();  // the head went out: the body cannot be completed
  }
}

void ProxiedExchange::respond_busy() {
  if (!call_ || !call_->responder) return;
  http::add(http::metrics().proxy_errors[http::ProcessMetrics::kBusy]);
  if (on_busy_) {
    std::string_view method(request);  // the request line's first word
    method = method.substr(0, method.find(' '));
    return respond(std::exchange(on_busy_, nullptr)(method, label_));
  }
  auto r = Response::status_only(503);
  r.header("Retry-After", "1");
  r.header("Corral-Proxy-Error", "upstream accept queue full");
  respond(std::move(r));
}

void ProxiedExchange::cut_body() {
  if (auto* w = std::exchange(writer_, nullptr)) return w->abort();
  if (body_) cut_ = true;  // its stream has not started: cut when it does (attach_writer)
}

void ProxiedExchange::on_room(std::unique_ptr<UpstreamConnection> c, bool reused_connection) {
  waiting_room_ = false;
  std::unique_ptr<ProxiedExchange> self = call_ ? call_->take_waiting() : nullptr;
  if (!self) {  // cannot happen: the call holds it while it waits; the connection goes back
    if (pool_ && c->idle()) pool_->give(std::move(c));
    return;
  }
  reused = reused_connection;
  c.release()->push(std::move(self));  // a busy connection owns itself (upstream_connection.h)
  read_body();
}

void ProxiedExchange::on_unreachable(std::string_view why) {
  waiting_room_ = false;
  std::unique_ptr<ProxiedExchange> self = call_ ? call_->take_waiting() : nullptr;
  if (!self) return;
  never_sent = true;
  fail(std::move(self), 502, why, true);
}

void ProxiedExchange::finish_body() {
  auto* w = writer_;
  writer_ = nullptr;
  if (w) w->end();
}

}  // namespace

Response proxy_to(Request& req, std::string unix_path, ProxyOptions options) {
  if (!req.loop) return Response::status_only(502);
  if (options.pool) ++options.pool->stats().requests;
  auto ex = std::make_unique<ProxiedExchange>(*req.loop, prepare_request(req, options),
                                              options.response_timeout_ms,
                                              req.method == Method::kHead, is_upgrade(req),
                                              options.pool, pipelinable(req), req.body_stream);
  ex->set_caller(options);
  ex->set_path(std::move(unix_path));
  return Response::deferred(std::make_unique<Call>(std::move(ex), nullptr, idempotent(req)));
}

Response proxy_found(Request& req, UpstreamFinder find, ProxyOptions options) {
  if (!req.loop) return Response::status_only(502);
  if (options.pool) ++options.pool->stats().requests;
  auto ex = std::make_unique<ProxiedExchange>(*req.loop, prepare_request(req, options),
                                              options.response_timeout_ms,
                                              req.method == Method::kHead, is_upgrade(req),
                                              options.pool, pipelinable(req), req.body_stream);
  ex->set_caller(options);
  return Response::deferred(
      std::make_unique<Call>(std::move(ex), std::move(find), idempotent(req), &req.upstream));
}

}  // namespace corral::proxy
