#include "quic/h3_mapping.h"

#include <charconv>

#include "http/default_headers.h"

namespace corral::quic {

namespace {

bool field_safe(std::string_view s) {
  for (char c : s)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

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

bool h3_header_allowed(std::string_view name, std::string_view value) {
  if (name.empty() || !field_safe(name) || !field_safe(value) || name[0] == ':') return false;
  // RFC 9114 §4.2: connection-specific fields are malformed in HTTP/3.
  for (std::string_view banned :
       {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
    if (http::iequals(name, banned)) return false;
  return true;
}

void response_head(int status, const http::Response& r, std::string_view content_type,
                   int64_t length, const FieldList* extra, std::string_view csp_nonce,
                   const HeadDefaults& d, FieldList& out) {
  out.clear();
  out.emplace_back(":status", std::to_string(status));
  out.emplace_back("server", std::string(d.server_name));
  out.emplace_back("date", std::string(d.date));
  if (!content_type.empty()) out.emplace_back("content-type", std::string(content_type));
  if (length >= 0) out.emplace_back("content-length", std::to_string(length));
  out.emplace_back("x-content-type-options", std::string(http::kNosniff));
  out.emplace_back("referrer-policy", std::string(d.referrer_policy));
  for (const auto& [k, v] : r.headers)
    if (h3_header_allowed(k, v)) out.emplace_back(lower(k), v);
  if (extra)
    for (const auto& [k, v] : *extra)
      if (h3_header_allowed(k, v)) out.emplace_back(lower(k), v);
  if (http::wants_default_csp(!csp_nonce.empty(), r)) {
    std::string csp;
    http::append_default_csp(csp, csp_nonce);
    out.emplace_back("content-security-policy", std::move(csp));
  }
}

FilePlan plan_file(const http::ResolvedFile& f, bool head_only) {
  FilePlan p;
  p.status = f.status;
  p.extra = f.headers;
  if (f.status >= 400 && !f.fd.valid()) {
    if (f.status == 416) {
      p.length = 0;
      return p;
    }
    std::string phrase(http::reason_phrase(f.status));
    phrase.push_back('\n');
    p.content_type = "text/plain; charset=utf-8";
    p.length = static_cast<int64_t>(phrase.size());
    if (!head_only) {
      p.segments.push_back({std::move(phrase), 0, 0});
      p.has_body = true;
    }
    return p;
  }
  if (!f.location.empty()) p.extra.emplace_back("Location", f.location);
  p.content_type = f.content_type;
  p.length = f.status == 304 ? -1 : static_cast<int64_t>(f.content_length);
  if (!f.fd.valid() || f.content_length == 0 || head_only) return p;
  p.has_body = true;
  if (f.parts.empty()) {
    http::ByteRange whole{0, f.size ? f.size - 1 : 0};
    http::ByteRange r = f.ranges.empty() ? whole : f.ranges.front();
    p.segments.push_back({{}, r.first, r.last - r.first + 1});
    return p;
  }
  for (const auto& part : f.parts) {
    p.segments.push_back({part.head, 0, 0});
    p.segments.push_back({{}, part.range.first, part.range.last - part.range.first + 1});
  }
  p.segments.push_back({f.tail, 0, 0});
  return p;
}

}  // namespace corral::quic
