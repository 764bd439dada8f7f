#include "http/request.h"

#include "http/text.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>

namespace corral::http {

static constexpr std::string_view kMethodNames[] = {
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "TRACK", "CONNECT", "",
};

std::string_view method_name(Method m) {
  return kMethodNames[static_cast<int>(m)];
}

Method parse_method(std::string_view name) {
  for (int i = 0; i < static_cast<int>(Method::kOther); ++i)
    if (kMethodNames[i] == name) return static_cast<Method>(i);
  return Method::kOther;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    unsigned char x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if (x == y) continue;
    if ((x | 0x20) != (y | 0x20) || (x | 0x20) < 'a' || (x | 0x20) > 'z') return false;
  }
  return true;
}

std::optional<std::string_view> Headers::get(std::string_view name) const {
  for (const auto& h : list_)
    if (iequals(h.name, name)) return h.value;
  return std::nullopt;
}

bool Headers::has_token(std::string_view name, std::string_view token) const {
  for (const auto& h : list_) {
    if (!iequals(h.name, name)) continue;
    std::string_view v = h.value;
    while (!v.empty()) {
      auto comma = v.find(',');
      if (iequals(trim_ows(v.substr(0, comma)), token)) return true;
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  return false;
}

size_t Headers::count(std::string_view name) const {
  size_t n = 0;
  for (const auto& h : list_)
    if (iequals(h.name, name)) ++n;
  return n;
}

std::string_view Request::param(std::string_view name) const {
  for (const auto& p : params)
    if (p.name == name) return p.value;
  return {};
}

namespace {
// Random bytes for nonces, drawn from getrandom() 4 KiB at a time: one syscall per 256 nonces.
class NoncePool {
 public:
  void take(unsigned char* out, size_t n) {
    if (pos_ + n > sizeof buf_) {
      size_t got = 0;
      while (got < sizeof buf_) {
        ssize_t r = getrandom(buf_ + got, sizeof buf_ - got, 0);
        if (r > 0) got += static_cast<size_t>(r);
      }
      pos_ = 0;
    }
    std::memcpy(out, buf_ + pos_, n);
    std::memset(buf_ + pos_, 0, n);  // a nonce is never handed out twice
    pos_ += n;
  }

 private:
  unsigned char buf_[4096];
  size_t pos_ = sizeof buf_;
};
thread_local NoncePool nonce_pool;  // per thread: the pool is process state, not shared
}  // namespace

std::string_view Request::csp_nonce() {
  if (nonce_len_ == 0) {
    unsigned char raw[18];  // 144 bits: 24 base64 characters, no padding needed
    nonce_pool.take(raw, sizeof raw);
    base64_encode(raw, sizeof raw, nonce_);
    nonce_len_ = 24;
  }
  return {nonce_, nonce_len_};
}

void Request::reset() {
  method = Method::kGet;
  method_name = target = path = query = body = host = pattern = {};
  version_major = version_minor = 1;
  headers.clear();
  body_stream = nullptr;
  remote_address.clear();
  scheme = "http";
  params.clear();
  wildcard.clear();
  principal.reset();
  nonce_len_ = 0;
  trace_len_ = 0;
  upstream.proxied = upstream.cold = false;
  upstream.address.clear();
  upstream.worker_pid = 0;
}

void Request::set_traceparent(std::string_view value) {
  trace_len_ = static_cast<uint8_t>(std::min(value.size(), sizeof trace_));
  std::memcpy(trace_, value.data(), trace_len_);
}

void Request::rebase(const char* old_base, size_t len, const char* new_base) {
  auto move = [&](std::string_view& v) {
    if (v.data() >= old_base && v.data() < old_base + len)
      v = std::string_view(new_base + (v.data() - old_base), v.size());
  };
  move(method_name);
  move(target);
  move(path);
  move(query);
  move(body);
  move(host);
  for (auto& h : headers.list()) {
    move(h.name);
    move(h.value);
  }
}

}  // namespace corral::http
