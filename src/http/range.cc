#include "http/range.h"

#include "http/text.h"

#include <algorithm>
#include <optional>

#include "http/http_date.h"
#include "http/request.h"

namespace corral::http {
namespace {

constexpr size_t kMaxDigits = 19;  // 10^19 - 1 < 2^64: no overflow check needed per digit

// 1*DIGIT, at most kMaxDigits of them, and nothing else.
std::optional<uint64_t> parse_number(std::string_view s) {
  if (s.empty() || s.size() > kMaxDigits) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

struct Spec {
  bool valid = false;
  bool satisfiable = false;
  ByteRange range;
};

// One range-spec: "a-b", "a-" or "-n".
Spec parse_spec(std::string_view s, uint64_t size) {
  Spec spec;
  size_t dash = s.find('-');
  if (dash == std::string_view::npos) return spec;
  std::string_view first_s = s.substr(0, dash), last_s = s.substr(dash + 1);
  if (first_s.empty()) {
    // suffix-range: the last n bytes; "-0" is valid but unsatisfiable.
    auto n = parse_number(last_s);
    if (!n) return spec;
    spec.valid = true;
    if (*n == 0 || size == 0) return spec;
    spec.satisfiable = true;
    spec.range = {*n >= size ? 0 : size - *n, size - 1};
    return spec;
  }
  auto first = parse_number(first_s);
  if (!first) return spec;
  uint64_t last = UINT64_MAX;
  if (!last_s.empty()) {
    auto l = parse_number(last_s);
    if (!l || *l < *first) return spec;  // §14.1.1: last-pos < first-pos is invalid
    last = *l;
  }
  spec.valid = true;
  if (*first >= size) return spec;
  spec.satisfiable = true;
  spec.range = {*first, std::min(last, size - 1)};
  return spec;
}

// Sorts and merges overlapping or adjacent ranges, if any overlap or touch; otherwise leaves the
// client's order alone.
void coalesce(std::vector<ByteRange>& ranges) {
  if (ranges.size() < 2) return;
  std::vector<ByteRange> sorted = ranges;
  std::sort(sorted.begin(), sorted.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.first < b.first; });
  std::vector<ByteRange> merged;
  merged.reserve(sorted.size());
  for (const ByteRange& r : sorted) {
    // last + 1 cannot overflow: last < size <= UINT64_MAX.
    if (!merged.empty() && r.first <= merged.back().last + 1) {
      merged.back().last = std::max(merged.back().last, r.last);
    } else {
      merged.push_back(r);
    }
  }
  if (merged.size() != ranges.size()) ranges = std::move(merged);
}

}  // namespace

RangeResult parse_range(std::string_view header, uint64_t size) {
  RangeResult result;
  header = trim_ows(header);
  size_t eq = header.find('=');
  if (eq == std::string_view::npos || !iequals(header.substr(0, eq), "bytes")) return result;
  std::string_view set = header.substr(eq + 1);

  std::vector<ByteRange> ranges;
  size_t specs = 0;
  while (!set.empty()) {
    size_t comma = set.find(',');
    std::string_view elem = trim_ows(set.substr(0, comma));
    set = comma == std::string_view::npos ? std::string_view() : set.substr(comma + 1);
    if (elem.empty()) continue;  // #rule: empty list elements are ignored
    if (++specs > kMaxRangeSpecs) return result;
    Spec spec = parse_spec(elem, size);
    if (!spec.valid) return result;
    if (spec.satisfiable) ranges.push_back(spec.range);
  }
  if (specs == 0) return result;  // "bytes=" or "bytes= , ": no range-spec at all
  if (ranges.empty()) {
    result.kind = RangeKind::kUnsatisfiable;
    return result;
  }
  coalesce(ranges);
  if (ranges.size() > kMaxRanges) return result;
  result.kind = RangeKind::kSatisfiable;
  result.ranges = std::move(ranges);
  return result;
}

bool if_range_allows(std::string_view if_range, std::string_view etag, time_t last_modified) {
  if_range = trim_ows(if_range);
  if (if_range.empty()) return false;
  if (if_range.front() == '"' || if_range.starts_with("W/")) {
    // Strong comparison: both strong and identical octets. A tag must be a quoted string.
    if (if_range.front() != '"' || if_range.size() < 2 || if_range.back() != '"') return false;
    if (etag.empty() || etag.front() != '"') return false;
    return if_range == etag;
  }
  auto date = parse_http_date(if_range);
  return date && *date == last_modified;
}

}  // namespace corral::http
