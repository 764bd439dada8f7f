// Response: a *description* of what to send, returned by a route. plan_response()
// (response_plan.h) turns it into a protocol-neutral plan: the default headers, the validated
// route headers, files resolved against the request's conditional and Range headers; the
// HTTP/1.1 connection and the HTTP/3 stream then only write that plan. Descriptions are plain
// values: a route can build one without a socket, and tests compare them directly.
//
// Kinds: text, html, json, bytes, redirect, status, file (see file_response.h), stream (a producer
// that writes when the connection can take more).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "core/transport.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace corral::core {
class EventLoop;
}

namespace corral::http {

// What a route asks to serve from disk.
struct FileSpec {
  // With a root: `path` is relative to it (usually what a "/static/*" route's wildcard matched),
  // and nothing outside the root is ever served ("..", symlinks leading out, NUL). Without a root:
  // `path` is an absolute path the application chose.
  std::string root;
  std::string path;
  std::string download_name;    // non-empty: Content-Disposition: attachment with this name
  std::string content_type;     // empty: by extension
  bool directory_index = true;  // a directory serves its index.html
  uint32_t max_age = 0;         // Cache-Control max-age seconds, 0: no Cache-Control header
  // With a root: whether a path segment starting with '.' (`.env`, `.git/config`, `a/.htpasswd`)
  // may be served. Off (the default): 404, except a first segment `.well-known` (RFC 8615), whose
  // own segments are checked the same way.
  bool dotfiles = false;
};

// The exchange's side of a stream (exchange.h), handed to the producer. Valid from on_start
// until on_abort or until end() returns.
class StreamWriter {
 public:
  // Queues data; returns false once the queued bytes pass the high-water mark: stop writing and
  // wait for on_writable. Data written after that is still queued (never dropped).
  virtual bool write(std::string_view data) = 0;
  virtual void end() = 0;
  // The body cannot be completed (its source failed): what was written still goes out, then the
  // client sees the message cut, never complete (HTTP/1.1: no last chunk, and the connection
  // closes; HTTP/3: the stream is reset). Like end(), the last call.
  virtual void abort() = 0;
  virtual size_t buffered() const = 0;

 protected:
  ~StreamWriter() = default;
};

class StreamProducer {
 public:
  virtual ~StreamProducer() = default;
  // The response head is out; write the first data (or arrange to, asynchronously).
  virtual void on_start(StreamWriter& w) = 0;
  // The queue drained below the low-water mark after a write() returned false.
  virtual void on_writable(StreamWriter& w) { (void)w; }
  // The client went away or the server is closing: stop producing; the writer is gone.
  virtual void on_abort() {}
};

class Server;

// An upgraded connection the server still knows about: it is told when the server closes
// (graceful: a WebSocket sends 1001) and when a new site is published (a socket whose route is
// gone closes with 1012). Owned by whoever took the connection over; it attaches itself to the
// Server and detaches before it is destroyed.
class Upgraded {
 public:
  virtual void server_closing() = 0;
  virtual void site_replaced(const class Site& site) = 0;
  // close_ms passed during a graceful close: close now; detaches before returning.
  virtual void force_close() = 0;
  Upgraded* prev_ = nullptr;  // Server's intrusive list
  Upgraded* next_ = nullptr;

 protected:
  ~Upgraded() = default;
};

// What an upgrade hands over once the 101 response is written: the connection's transport (the
// socket, plain or TLS: every byte goes on through it; it is no longer registered with the loop),
// the bytes the client sent after its upgrade request (already decrypted), and response bytes
// not yet written.
struct UpgradeContext {
  core::EventLoop& loop;
  Server& server;
  std::unique_ptr<core::Transport> transport;
  std::string leftover_input;
  std::string pending_output;
  std::string peer;  // the client's address, for logs
};

class UpgradeHandler {
 public:
  virtual ~UpgradeHandler() = default;
  virtual void take_over(UpgradeContext ctx) = 0;
};

struct UpgradeBody {
  std::unique_ptr<UpgradeHandler> handler;
};

class Response;

// The exchange's side of a deferred response: respond() once, with any description but another
// deferred one. Valid until respond() or the producer's on_abort().
class Responder {
 public:
  virtual void respond(Response response) = 0;

 protected:
  ~Responder() = default;
};

// A response whose head is not known when the route returns (a proxy waiting for its upstream).
class DeferredProducer {
 public:
  virtual ~DeferredProducer() = default;
  virtual void start(Responder& responder) = 0;
  // The client went away or the server closed first: stop; the responder is gone.
  virtual void on_abort() {}
};

struct DeferredBody {
  std::unique_ptr<DeferredProducer> producer;
};

struct StreamBody {
  std::unique_ptr<StreamProducer> producer;
  std::optional<uint64_t> length;  // known: Content-Length; unknown: chunked (HTTP/1.1)
};

class Response {
 public:
  using HeaderList = std::vector<std::pair<std::string, std::string>>;
  using Body =
      std::variant<std::monostate, std::string, FileSpec, StreamBody, UpgradeBody, DeferredBody>;

  Response() = default;
  Response(Response&&) = default;
  Response& operator=(Response&&) = default;

  static Response text(std::string body, int status = 200);
  static Response html(std::string body, int status = 200);
  static Response json(const nlohmann::json& value, int status = 200);
  static Response bytes(std::string data,
                        std::string_view content_type = "application/octet-stream",
                        int status = 200);
  static Response redirect(std::string location, int status = 302);
  // A bare status; 4xx/5xx carry their reason phrase as a short text body.
  static Response status_only(int status);
  static Response file(FileSpec spec);
  static Response stream(std::unique_ptr<StreamProducer> producer,
                         std::string_view content_type = "application/octet-stream",
                         std::optional<uint64_t> length = std::nullopt);

  // The head comes later: `producer` is started and responds through a Responder.
  static Response deferred(std::unique_ptr<DeferredProducer> producer);
  // 101 Switching Protocols; `handler` takes the connection over once the head is written.
  static Response upgrade(std::unique_ptr<UpgradeHandler> handler);

  Response& header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  // A static content type (a literal or a string that outlives the response) costs no copy.
  Response& set_content_type_static(std::string_view type) {
    content_type_ = type;
    content_type_owned_.clear();
    return *this;
  }
  Response& set_content_type(std::string type) {
    content_type_owned_ = std::move(type);
    content_type_ = {};
    return *this;
  }
  std::string_view content_type() const {
    return content_type_owned_.empty() ? content_type_ : std::string_view(content_type_owned_);
  }
  std::optional<std::string_view> find_header(std::string_view name) const;
  bool is_html() const;

  int status = 200;
  HeaderList headers;
  Body body;

 private:
  std::string_view content_type_;
  std::string content_type_owned_;
};

std::string_view reason_phrase(int status);
// The phrase and a newline ("Not Found\n"): the short text body of a bare 4xx/5xx. Static.
std::string_view reason_line(int status);

}  // namespace corral::http
