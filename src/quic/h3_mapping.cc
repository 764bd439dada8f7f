#include "quic/h3_mapping.h"

#include <charconv>

namespace corral::quic {

void RequestHead::add(Pseudo pseudo, std::string_view name, std::string_view value) {
  bytes_ += name.size() + value.size() + 32;  // RFC 9114 §4.2.2 counts 32 bytes per field
  storage_.emplace_back(value);
  std::string_view v = storage_.back();
  auto set = [&](std::string_view& slot) {
    if (!slot.data()) {
      slot = v;
    } else {
      ++duplicates_;
    }
  };
  if (pseudo != Pseudo::kNone && !regular_.empty()) pseudo_after_regular_ = true;
  switch (pseudo) {
    case Pseudo::kMethod:
      set(method_);
      return;
    case Pseudo::kScheme:
      set(scheme_);
      return;
    case Pseudo::kAuthority:
      set(authority_);
      return;
    case Pseudo::kPath:
      set(path_);
      return;
    case Pseudo::kProtocol:
    case Pseudo::kUnknown:
      unknown_pseudo_ = true;
      return;
    case Pseudo::kNone:
      break;
  }
  storage_.emplace_back(name);
  regular_.emplace_back(storage_.back(), v);
}

std::optional<std::string_view> RequestHead::field(std::string_view name) const {
  for (const auto& [n, v] : regular_)
    if (http::iequals(n, name)) return v;
  return std::nullopt;
}

int RequestHead::build(http::Request& req, const Limits& limits) const {
  if (bytes_ > limits.max_bytes || regular_.size() > limits.max_fields) {
    reason_ = "request header fields too large";
    return 431;
  }
  if (duplicates_ || unknown_pseudo_ || pseudo_after_regular_ || !method_.data()) {
    reason_ = "malformed pseudo-header fields";
    return 400;
  }
  req.method_name = method_;
  req.method = http::parse_method(method_);
  req.version_major = 3;
  req.version_minor = 0;
  // CONNECT carries only :method and :authority (RFC 9114 §4.4); admission refuses it (501).
  if (req.method != http::Method::kConnect) {
    if (!scheme_.data() || !path_.data() || path_.empty()) {
      reason_ = "missing :scheme or :path";
      return 400;
    }
  }
  req.target = path_;
  auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  req.query = q == std::string_view::npos ? std::string_view{} : req.target.substr(q + 1);
  // :authority stands for Host (admission validates and checks it). A request with both must
  // agree (RFC 9114 §4.3.1): a differing Host is a duplicate Host for admission (400).
  if (authority_.data()) req.headers.add("host", authority_);
  for (const auto& [name, value] : regular_) {
    if (authority_.data() && http::iequals(name, "host") && value == authority_) continue;
    req.headers.add(name, value);
  }
  return 0;
}

H3Head::H3Head(const http::ResponsePlan& plan) {
  char status[16];
  auto st = std::to_chars(status, status + sizeof status, plan.status);
  char length[24];
  size_t length_len = 0;
  if (plan.content_length)
    length_len = static_cast<size_t>(
        std::to_chars(length, length + sizeof length, *plan.content_length).ptr - length);
  // Reserved once: the name/value pairs point into bytes_, which must never move.
  size_t total = 7 + static_cast<size_t>(st.ptr - status) + 14 + length_len;
  for (const http::Field& f : plan.fields) total += f.name.size() + f.value.size();
  bytes_.reserve(total);
  nva_.reserve(plan.fields.size() + 2);
  add(":status", {status, static_cast<size_t>(st.ptr - status)}, false);
  for (size_t i = 0; i < plan.fields.size(); ++i) {
    if (i == plan.framing_at && plan.content_length)
      add("content-length", {length, length_len}, false);
    add(plan.fields[i].name, plan.fields[i].value, true);
  }
  if (plan.framing_at >= plan.fields.size() && plan.content_length)
    add("content-length", {length, length_len}, false);
}

void H3Head::add(std::string_view name, std::string_view value, bool lower) {
  size_t at = bytes_.size();
  bytes_.append(name);
  if (lower)
    for (size_t i = at; i < bytes_.size(); ++i)
      if (bytes_[i] >= 'A' && bytes_[i] <= 'Z')
        bytes_[i] = static_cast<char>(bytes_[i] - 'A' + 'a');
  bytes_.append(value);
  nghttp3_nv nv;
  nv.name = reinterpret_cast<uint8_t*>(bytes_.data() + at);
  nv.namelen = name.size();
  nv.value = reinterpret_cast<uint8_t*>(bytes_.data() + at + name.size());
  nv.valuelen = value.size();
  nv.flags = NGHTTP3_NV_FLAG_NONE;  // nghttp3 copies name and value
  nva_.push_back(nv);
}

std::string_view H3Head::name(size_t i) const {
  return {reinterpret_cast<const char*>(nva_[i].name), nva_[i].namelen};
}

std::string_view H3Head::value(size_t i) const {
  return {reinterpret_cast<const char*>(nva_[i].value), nva_[i].valuelen};
}

std::optional<std::string_view> H3Head::field(std::string_view n) const {
  for (size_t i = 0; i < nva_.size(); ++i)
    if (name(i) == n) return value(i);
  return std::nullopt;
}

}  // namespace corral::quic
