// Range requests (RFC 9110 §14): parsing a Range header against a representation's size, and
// deciding whether an If-Range validator still allows the partial response. Sans-IO and pure:
// file_response.cc applies the result to a file, tests and the fuzzer call these directly.
//
// Defensive by design (§14.2 lets a server ignore abusive range sets): overlapping or adjacent
// ranges are coalesced, and a set that still has more than kMaxRanges ranges is ignored (the whole
// representation is served with 200), so a request can neither multiply the bytes sent nor make
// the server produce thousands of tiny parts.
#pragma once

#include <cstdint>
#include <ctime>
#include <string_view>
#include <vector>

namespace corral::http {

inline constexpr size_t kMaxRanges = 16;
// Range specs read before the header is ignored outright (before coalescing); bounds the work a
// single header can cause.
inline constexpr size_t kMaxRangeSpecs = 256;

// Inclusive byte positions, first <= last < size.
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t length() const { return last - first + 1; }
  bool operator==(const ByteRange&) const = default;
};

enum class RangeKind {
  kNone,           // no Range header, or one to ignore (invalid, unknown unit, abusive): serve 200
  kSatisfiable,    // serve `ranges` with 206
  kUnsatisfiable,  // 416 with "Content-Range: bytes */size"
};

struct RangeResult {
  RangeKind kind = RangeKind::kNone;
  // For kSatisfiable: one or more ranges, clamped to the size. In the order the client listed
  // them (§15.3.7.2), unless some overlapped or touched: then coalesced and sorted ascending.
  std::vector<ByteRange> ranges;
};

// `header` is the Range field value, e.g. "bytes=0-99, 200-, -50". The unit is matched
// case-insensitively; list elements may carry optional whitespace; empty elements are skipped.
// "a-b" with b < a, a number of more than 19 digits, or any other syntax error makes the whole
// header ignorable (kNone). A range whose first byte is at or past `size`, or a "-0" suffix, is
// unsatisfiable; the header is kUnsatisfiable when every range is (always so when size == 0).
RangeResult parse_range(std::string_view header, uint64_t size);

// If-Range (§13.1.5): true when the partial response may be sent. An entity tag must match
// `etag` exactly by strong comparison (a weak tag, on either side, never matches); an HTTP-date
// must equal `last_modified`. Anything unparsable is false (send the whole representation).
bool if_range_allows(std::string_view if_range, std::string_view etag, time_t last_modified);

}  // namespace corral::http
