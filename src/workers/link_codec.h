// The link between a server process and the supervisor, as typed messages: a sans-IO codec
// (STYLE rule 2) that both ends use, LinkResolver in the server process (workers/resolver.h) and
// serve_link in the supervisor (workers/link_server.h). Text in, a message or an error value out;
// a message in, text out. No sockets, no state: what the unit test and the fuzzer drive.
//
// The link is a SEQPACKET socketpair made by the supervisor before the fork (core::MessageLink,
// at most 64 KiB a message); each packet is one JSON object with a "type":
//
//   server -> supervisor
//     {"type":"resolve","id":N,"address":"doc:42"}
//         the worker socket for the address, starting its worker if needed. N > 0 is the
//         server's own, echoed in the answer.
//     {"type":"report","quic":{...}}, {"type":"report","proxy":{...}}
//         every second, the process's own state for the control API's GET /processes; each
//         report's keys replace the same keys of the last (the rest is kept).
//   supervisor -> server
//     {"type":"resolved","id":N,"socket":"/state/sockets/doc%3A42.sock","pid":P,"cold":true}
//         the worker's pid (omitted when unknown) and whether the request waited for its start
//         ("cold" omitted when it did not): what the server's access log says of the request.
//     {"type":"refused","id":N,"status":503,"error":{"message":...,"code":...},"retryAfter":S}
//         the client's answer instead of a worker: the status (400-599), the public error and,
//         when a bound refused it, Retry-After: S (omitted when 0).
//     {"type":"forget","address":"doc:42"}
//         an address this process was given stopped being a running, unsuspended worker: drop
//         its cached socket.
//
// An address is bytes; on the link it is its wire form (core::wire_encode: '%' and what is not
// text as %XX, docs/worker-protocol.md), as in the Corral-Address header a worker gets. The typed
// messages hold the bytes: encode and decode convert.
//
// Decoding is of untrusted input (either end may be the one that misbehaves): it never throws or
// asserts, and answers an error value for what is not a message, including a text over 64 KiB
// (core::MessageLink's bound) or nested more than 16 levels deep (copying and dumping JSON
// recurse). What identifies a message is strict: its type, an id > 0 (resolve, resolved, refused),
// a wire-form address (forget), a non-empty socket (resolved). What only shapes an answer is
// lenient, so that an answer to a waiting request is never dropped for it: a "pid" that is not a
// positive number is 0, a "cold" that is not true is false, a missing or wrong "status" is 503,
// a "retryAfter" that is not a count of seconds is 0 (at most a day), an "error" that is not an
// object is none. A resolve whose address is not a wire form still decodes, without
// an address: the supervisor answers it 400 rather than leaving the request waiting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace corral::workers::link {

struct Resolve {
  uint64_t id = 0;
  std::optional<std::string> address;  // the bytes; nullopt: the text was not a wire form
};
struct Resolved {
  uint64_t id = 0;
  std::string socket;  // the worker's socket path
  int64_t pid = 0;     // the worker's; 0 when not said
  bool cold = false;   // the request waited for the worker's start
};
struct Refused {
  uint64_t id = 0;
  int status = 503;
  nlohmann::json error;  // {message, code?, reason?}; null when none was given
  uint32_t retry_after_s = 0;
};
struct Forget {
  std::string address;  // the bytes
};
struct Report {
  nlohmann::json fields = nlohmann::json::object();  // the report's keys, without "type"
};

using Message = std::variant<Resolve, Resolved, Refused, Forget, Report>;

// The message's text. Never throws: a string that is not UTF-8 (a socket path, a public error)
// is written with U+FFFD; an address is always written in its wire form.
std::string encode(const Message& message);

// The message `text` holds, or an Error (code EINVAL, a static reason for the log). Never throws.
core::Result<Message> decode(std::string_view text);

}  // namespace corral::workers::link
