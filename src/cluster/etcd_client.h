// Client: etcd v3 over its HTTP/JSON gateway, on the process's core::EventLoop. Each call is one
// HTTP/1.1 POST on a keep-alive TCP connection (a small pool, at most max_connections at once;
// calls beyond that wait in order); the body is what etcd_codec.h encodes, the answer is decoded
// and handed to the call's callback, always from the loop (never inside the call itself).
//
// Endpoints: several ("http://127.0.0.1:2379", IP literals or localhost; TLS to etcd is not built
// yet). Calls go to the current one; a connection that fails or times out moves the client to the
// next. A call whose request provably did not reach etcd (the connect failed, or a reused idle
// connection was closed before any answer) is sent again on the next endpoint, once per
// endpoint; one that may have reached it fails with its error and the caller decides (a txn or a
// put may have been applied: read before writing again). Every call ends within
// request_timeout_ms, with ETIMEDOUT if nothing better.
//
// Watch: one long HTTP response per watch on its own connection, newline-delimited JSON. When it
// breaks (etcd restarted, the connection reset, a member went away) it reconnects by itself, with
// a backoff, on the next endpoint, from the revision after the last one it delivered: no event is
// lost or repeated, unless etcd compacted them away (on_compacted: read the state again).
//
// Lifetime: the Client outlives its Watches and must not be destroyed inside one of its
// callbacks; a caller that goes away first calls cancel(owner) so that its callbacks are never
// called. A Watch may be destroyed anywhere, its own callbacks included. One thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/etcd_codec.h"
#include "core/event_loop.h"
#include "core/result.h"
#include "core/socket.h"
#include "core/timer_wheel.h"

namespace corral::cluster {

struct ClientOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379", "127.0.0.1:2379"
  uint64_t request_timeout_ms = 5000;
  uint64_t connect_timeout_ms = 1000;
  size_t max_connections = 4;
  // A watch's reconnection backoff: doubles from the first to the most.
  uint64_t watch_backoff_first_ms = 50;
  uint64_t watch_backoff_max_ms = 2000;
};

class Client;

class WatchHandler {
 public:
  // A response of the stream: created, events (in revision order), or a progress notification.
  virtual void on_watch(const WatchResponse& response) = 0;
  // etcd compacted the revisions the watch would resume from: events were lost. The watch goes
  // on from `compact_revision`; the handler reads the state again (a range) to catch up.
  virtual void on_compacted(int64_t compact_revision) = 0;
  // The stream broke (it reconnects by itself); for logs and health.
  virtual void on_watch_broken(const core::Error& /*why*/) {}

 protected:
  ~WatchHandler() = default;
};

class Watch {
 public:
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;
  // The revision the stream resumes from after a break.
  int64_t next_revision() const { return next_revision_; }
  bool connected() const { return created_; }

 private:
  friend class Client;
  class Stream;
  Watch(Client& client, WatchRequest request, WatchHandler& handler);
  void connect();
  // The stream broke: drop it, reconnect after the backoff (on the next endpoint if it was the
  // endpoint's fault).
  void broken(core::Error why, bool endpoint_fault);
  core::EventLoop& loop();
  void deliver();  // the complete lines read so far, to the handler

  Client& client_;
  WatchRequest request_;
  WatchHandler& handler_;
  int64_t next_revision_;
  bool created_ = false;
  uint64_t backoff_ms_ = 0;
  std::unique_ptr<Stream> stream_;
  core::Timer retry_;
  bool* dead_ = nullptr;  // set while a callback runs: tells it that `this` was destroyed
};

class Client {
 public:
  template <typename T>
  using Done = std::function<void(core::Result<T>)>;

  // Fails on an endpoint that is not http://IP:port.
  static core::Result<std::unique_ptr<Client>> create(core::EventLoop& loop, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // `owner`: what cancel() names (nullptr: nobody cancels it).
  void range(const RangeRequest& r, Done<RangeResponse> done, const void* owner = nullptr);
  void put(const PutRequest& r, Done<PutResponse> done, const void* owner = nullptr);
  void delete_range(const DeleteRangeRequest& r, Done<DeleteRangeResponse> done,
                    const void* owner = nullptr);
  void txn(const TxnRequest& r, Done<TxnResponse> done, const void* owner = nullptr);
  void lease_grant(int64_t ttl_s, Done<LeaseGrantResponse> done, const void* owner = nullptr);
  // One keep-alive (a request on the gateway's stream that ends after its one answer).
  void lease_keepalive(int64_t id, Done<LeaseKeepAliveResponse> done, const void* owner = nullptr);
  void lease_revoke(int64_t id, Done<LeaseRevokeResponse> done, const void* owner = nullptr);
  // GET /health: ok when the member answers {"health":"true"}.
  void health(Done<bool> done, const void* owner = nullptr);
  // Starts a watch now (it connects in the background).
  std::unique_ptr<Watch> watch(WatchRequest request, WatchHandler& handler);

  // Forgets the callbacks of `owner`'s calls: those not sent are dropped, the others' answers are
  // read and thrown away.
  void cancel(const void* owner);

  core::EventLoop& loop() { return loop_; }
  const ClientOptions& options() const { return options_; }
  // The endpoint calls and new watches go to; failures move it on.
  size_t current_endpoint() const { return current_; }
  size_t connections() const { return connections_.size(); }

 private:
  friend class Watch;
  struct Call;
  class Connection;
  struct Endpoint {
    core::SocketAddress address;
    std::string host;  // the Host field
  };

  Client(core::EventLoop& loop, ClientOptions options, std::vector<Endpoint> endpoints);
  void call(std::string method, std::string_view path, std::string body,
            std::function<void(core::Result<std::string>)> done, const void* owner);
  void schedule_dispatch();
  void dispatch();
  void complete(std::unique_ptr<Call> call, core::Result<std::string> result);
  void timed_out(Call* call);
  // A connection ended: it goes, and its call is retried or failed.
  void connection_done(Connection* conn, core::Result<std::string> result, bool retryable,
                       bool endpoint_fault);
  void endpoint_failed(size_t index);
  std::unique_ptr<Call> take(Call* call);  // out of the queue

  core::EventLoop& loop_;
  ClientOptions options_;
  std::vector<Endpoint> endpoints_;
  size_t current_ = 0;
  std::deque<std::unique_ptr<Call>> queue_;
  std::vector<std::unique_ptr<Connection>> connections_;
  bool dispatch_scheduled_ = false;
  // Shared with the deferred dispatch (EventLoop::defer cannot be cancelled): false once the
  // client is gone, so a dispatch deferred before that does nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// "http://IP:port" (or "IP:port", "localhost:port"): the address and the Host field, or why not.
core::Result<std::pair<core::SocketAddress, std::string>> parse_endpoint(std::string_view text);

// The request bytes of one call: "METHOD path HTTP/1.1", Host, a JSON body.
std::string http_request(std::string_view method, std::string_view path, std::string_view host,
                         std::string_view body);

}  // namespace corral::cluster
