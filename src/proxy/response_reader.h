// ResponseReader: the sans-IO HTTP/1.1 response reader of the upstream client (STYLE rule 2):
// bytes in, events out (a head, body chunks, the end of the response, a protocol switch, an
// error). No sockets, no timers: the UpstreamConnection feeds it what it reads, the unit test and
// the fuzzer feed it whatever they like.
//
// One reader per upstream connection, restarted (start) for each response on it: pipelined
// responses come back to back, and feed() stops at the end of each one (`used`), so the bytes
// after it are the next response's. Interim responses (1xx) are read past, except a 101 that the
// request asked for (an upgrade): then feed() stops after its head and the rest is the upgraded
// protocol. A response to HEAD, 204 and 304 have no body, whatever their fields say (RFC 9112
// §6.3): bytes after their head are not theirs; otherwise the body is chunked, has a
// Content-Length, or runs until the upstream closes (finish()). A transfer coding other than
// chunked (`gzip, chunked`) is an error: the proxy does not decode it, and a client that did not
// ask for it (TE) must not get it.
//
// Which request a response answers: start() may name the request's sequence number (the
// Corral-Seq field the connection added to it); the final response must then carry the same
// value back, or it is an error (kNotItsResponse): it answers another request (a worker that
// wrote one response too many). A response that carries a Corral-Seq its request did not have is
// that error too.
//
// Header names that arrive in one read are views into it; one split across reads is copied. Only
// the fields the reader keeps (not `dropped(name)`; all of them for an upgrade) are stored, and
// Content-Type apart. Single-threaded; llhttp allocates nothing.
#pragma once

#include <llhttp.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace corral::proxy {

struct ResponseHead {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // those kept, in order
  std::string content_type;
  std::optional<uint64_t> content_length;  // a Content-Length field (a HEAD's included)
  // The values of its Connection fields, joined by ',' (the fields they name are hop-by-hop:
  // fields.h, ConnectionOptions).
  std::string connection;
};

class ResponseReader {
 public:
  // Where the events of a response go. on_head comes once per final response (interim ones are
  // read past); on_body may come many times; both during feed().
  class Events {
   public:
    virtual void on_head(ResponseHead& head) = 0;
    virtual void on_body(std::string_view data) = 0;

   protected:
    ~Events() = default;
  };
  // Fields not stored (the caller would drop them anyway).
  using DroppedHeader = bool (*)(std::string_view name);

  enum class State {
    kMore,      // all bytes used; the response goes on
    kComplete,  // the response ended after `used` bytes
    kSwitched,  // a requested 101: its head ended after `used` bytes, the rest is not HTTP
    kError,     // malformed (or a 101 nobody asked for, or too many 1xx)
  };
  struct Fed {
    State state;
    size_t used;
  };

  static constexpr uint32_t kMaxInterim = 16;  // 1xx responses read past before the final one
  // Field names and values of one response head (1xx heads count too): past this the response is
  // malformed (502), so a worker cannot make the proxy buffer fields without end. The request side
  // allows 64 KiB by default (max_head_bytes); a worker's head is its own app's, so the same.
  static constexpr size_t kMaxHeadBytes = 64 * 1024;

  explicit ResponseReader(DroppedHeader dropped = nullptr);
  ResponseReader(const ResponseReader&) = delete;
  ResponseReader& operator=(const ResponseReader&) = delete;

  // The next response on the connection: to a HEAD request (no body), or to an upgrade request
  // (a 101 is the answer and keeps every field). `seq`: the request's Corral-Seq (0: it had
  // none); `seq_required`: a final response that does not echo it is not the request's.
  void start(Events& events, bool head_request, bool upgrade_requested, uint64_t seq = 0,
             bool seq_required = false);
  Fed feed(const char* data, size_t n);
  // The upstream closed: a body delimited by the close ends here (kComplete); a response cut
  // short, or none at all, is kError.
  State finish();
  bool head_seen() const { return head_seen_; }
  bool complete() const { return complete_; }
  // After the final head: it echoed the `seq` start() named.
  bool seq_echoed() const { return seq_echoed_; }
  // After kError: why, a static string ("malformed upstream response" unless more is known).
  std::string_view error() const { return error_; }
  // kError because the response is not the request's (its Corral-Seq).
  bool not_its_response() const { return error_ == kNotItsResponse; }
  static constexpr std::string_view kNotItsResponse = "upstream response not the request's";
  static constexpr std::string_view kTransferCoding = "upstream transfer coding other than chunked";
  // After kComplete: the connection may carry another response.
  bool keep_alive() const { return llhttp_should_keep_alive(&parser_) != 0; }

 private:
  static int on_header_field(llhttp_t* p, const char* at, size_t n);
  static int on_header_field_complete(llhttp_t* p);
  static int on_header_value(llhttp_t* p, const char* at, size_t n);
  static int on_header_value_complete(llhttp_t* p);
  static int on_headers_complete(llhttp_t* p);
  static int on_body(llhttp_t* p, const char* at, size_t n);
  static int on_message_complete(llhttp_t* p);
  void keep_name();                         // name_ must outlive the read it points into
  int final_head_error(const llhttp_t* p);  // the seq and transfer-coding checks: 0 or -1

  DroppedHeader dropped_;
  Events* events_ = nullptr;
  llhttp_settings_t settings_;
  llhttp_t parser_;
  ResponseHead head_;
  std::string_view name_;  // of the field being parsed (a view into the read, or name_copy_)
  std::string name_copy_;  // a name split across reads
  uint32_t interims_ = 0;
  bool head_request_ = false;
  bool upgrade_requested_ = false;
  size_t head_bytes_ = 0;  // of field names and values so far (kMaxHeadBytes)
  uint64_t seq_ = 0;       // start()'s
  bool seq_required_ = false;
  bool seq_echoed_ = false;
  // The field being parsed, when its value is kept apart from head_.headers.
  enum class Special : uint8_t { kNone, kType, kConnection, kSeq, kTransferEncoding };
  Special special_ = Special::kNone;
  std::string echoed_;      // the Corral-Seq value of the response being parsed
  std::string codings_;     // its Transfer-Encoding values, joined by ','
  bool has_echo_ = false;   // it has a Corral-Seq field
  std::string_view error_;  // after kError
  bool keep_ = false;       // the field being parsed is stored
  bool interim_ = false;    // the response being parsed is a 1xx
  bool switching_ = false;
  bool head_seen_ = false;
  bool complete_ = false;
};

}  // namespace corral::proxy
