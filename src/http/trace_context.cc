#include "http/trace_context.h"

#include <sys/random.h>

#include <cstring>
#include <ctime>

namespace corral::http {

namespace {

bool lower_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool all_zero(std::string_view s) {
  return s.find_first_not_of('0') == std::string_view::npos;
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

void put_hex(uint64_t v, char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i) {
    out[i] = kHex[v & 15];
    v >>= 4;
  }
}

}  // namespace

bool valid_traceparent(std::string_view v) {
  if (v.size() != kTraceparentSize || v[2] != '-' || v[35] != '-' || v[52] != '-') return false;
  std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16),
                   flags = v.substr(53, 2);
  return version == "00" && lower_hex(trace) && lower_hex(parent) && lower_hex(flags) &&
         !all_zero(trace) && !all_zero(parent);
}

TraceIds::TraceIds() {
  std::memset(s_, 0, sizeof s_);
  size_t got = 0;
  auto* p = reinterpret_cast<unsigned char*>(s_);
  while (got < sizeof s_) {
    ssize_t r = getrandom(p + got, sizeof s_ - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  // Never the all-zero state (xoshiro's one fixed point), even without getrandom.
  s_[0] ^= static_cast<uint64_t>(time(nullptr)) | 1;
}

uint64_t TraceIds::next() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

void TraceIds::make(char out[kTraceparentSize]) {
  std::memcpy(out, "00-", 3);
  uint64_t hi = next(), lo = next(), parent = next();
  if ((hi | lo) == 0) lo = 1;  // never all zero
  if (parent == 0) parent = 1;
  put_hex(hi, out + 3);
  put_hex(lo, out + 19);
  out[35] = '-';
  put_hex(parent, out + 36);
  std::memcpy(out + 52, "-00", 3);
}

}  // namespace corral::http
