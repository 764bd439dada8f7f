// A streamed request body: what a route that opted in (RouteOptions::stream_body, site.h) reads
// instead of a buffered Request::body. The route runs once the head is parsed; the body then
// arrives in pieces, with explicit backpressure both ways:
//
//   - the connection reads nothing of the body before a consumer asks for it (read()), and sends
//     the client's `Expect: 100-continue` answer only then: a route that answers at once (403,
//     413) never invites the body;
//   - each piece is handed to BodyConsumer::on_body_data and is the consumer's from then on (the
//     view is valid during the call only: copy or send it); returning false stops the connection:
//     it takes no more from the socket (at most one read's worth, 16 KiB, waits in its input)
//     until resume(). Nothing is buffered without bound on either side;
//   - on_body_end after the last byte (Content-Length reached, or the last chunk; trailers are
//     checked and dropped, as for a buffered body);
//   - on_body_abort when the body cannot be complete: the client left, the chunked framing is
//     malformed (400), a chunked body passed the route's max_body (413), the body timeout, or the
//     response ended before the body did. After an abort the connection answers the error if no
//     response head went out yet, else closes.
//
// A response that ends while its body is still coming closes the connection after it is written
// (with `Connection: close`): the rest of the body is never parsed as a request.
//
// Lifetime: the BodyStream (Request::body_stream, the request's Exchange) is valid until the
// consumer got on_body_end or on_body_abort, or detached with read(nullptr); a consumer that is
// destroyed before either must detach first. Callbacks never run inside read() or resume() (they
// run from the loop), so a consumer may call them from anywhere. Single-threaded: the loop's.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace corral::http {

// What the connection asks of the site once a request head with a body is parsed: the body
// limit of the route the request goes to, and whether it reads the body streamed (site.h,
// RouteOptions).
struct BodyRule {
  uint64_t max_body = 0;
  bool stream = false;
};

class BodyConsumer {
 public:
  // A piece of the decoded body, never empty. False: take no more until resume().
  virtual bool on_body_data(std::string_view piece) = 0;
  // The whole body was delivered. The stream is gone.
  virtual void on_body_end() = 0;
  // The body cannot be complete (`why` is static text for logs). The stream is gone.
  virtual void on_body_abort(std::string_view why) = 0;

 protected:
  ~BodyConsumer() = default;
};

class BodyStream {
 public:
  // Starts (or, after read(nullptr), continues) delivering to `consumer`; null detaches: nothing
  // more is delivered until a consumer reads again (and if none does before the response ends,
  // the connection closes after it).
  virtual void read(BodyConsumer* consumer) = 0;
  // After on_body_data returned false: go on.
  virtual void resume() = 0;
  // The body's length when the client sent Content-Length; nullopt when it is chunked.
  virtual std::optional<uint64_t> length() const = 0;
  // Body bytes delivered so far.
  virtual uint64_t delivered() const = 0;

 protected:
  ~BodyStream() = default;
};

}  // namespace corral::http
