// W3C Trace Context (https://www.w3.org/TR/trace-context/): each request carries a `traceparent`
// ("00-<trace-id>-<parent-id>-<flags>", 55 characters, lower-case hex). The server keeps a
// client's when it is valid (version 00, a trace-id and a parent-id that are not all zero) and
// makes one otherwise, so that every request has one: the access log writes it, the proxy passes
// it to the worker, the worker libraries expose it.
//
// TraceIds makes them from a xoshiro256** generator seeded once from getrandom() (no syscall per
// request). One per Server, on its loop: single-threaded. A forked process makes its own Server,
// and so its own seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace corral::http {

constexpr size_t kTraceparentSize = 55;

// Whether `value` is a valid version-00 traceparent (exactly, lower-case hex).
bool valid_traceparent(std::string_view value);

class TraceIds {
 public:
  TraceIds();
  // A fresh traceparent (random trace-id and parent-id, flags 00) into `out`.
  void make(char out[kTraceparentSize]);

 private:
  uint64_t next();
  uint64_t s_[4];
};

}  // namespace corral::http
