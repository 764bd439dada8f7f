#include "http/response_plan.h"

#include <charconv>
#include <cstring>

namespace corral::http {

namespace {

constexpr std::string_view kTextPlain = "text/plain; charset=utf-8";

// The security defaults of every response but a 101: X-Content-Type-Options: nosniff, and for
// HTML a Content-Security-Policy with the request's fresh nonce for inline scripts and styles,
// unless the route set its own.
constexpr std::string_view kNosniff = "nosniff";

bool wants_default_csp(bool has_nonce, const Response& r) {
  return has_nonce && r.is_html() && !r.find_header("content-security-policy");
}

// Appends to a fixed array, for the CSP value (no allocation per HTML response): 186 bytes with
// the 24-character nonce, in ResponsePlan's 256 (a longer value would be cut, never overrun).
struct FixedText {
  char* data;
  size_t cap;
  size_t size = 0;
  void append(std::string_view s) {
    size_t n = s.size() < cap - size ? s.size() : cap - size;
    std::memcpy(data + size, s.data(), n);
    size += n;
  }
};

void append_default_csp(FixedText& out, std::string_view nonce) {
  out.append(std::string_view("default-src 'self'; script-src 'self' 'nonce-"));
  out.append(nonce);
  out.append(std::string_view("'; style-src 'self' 'nonce-"));
  out.append(nonce);
  out.append(std::string_view("'; object-src 'none'; base-uri 'self'; frame-ancestors 'self'"));
}

bool field_safe(std::string_view s) {
  for (char c : s)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}

// The judgment of a header a route set is in two parts (the essay in the header states the
// rules): whether it refuses the whole response, which plan_response() asks of every header once
// before anything is planned, and then, for those it let through, whether it goes out. The bytes
// are scanned once per header: a proxied response relays many.
bool field_refused(std::string_view name, std::string_view value) {
  return name.empty() || !field_safe(name) || !field_safe(value);
}

// By length first: one comparison or two per header instead of a dozen.
bool route_field_sent(std::string_view name, Protocol protocol, bool upgrade) {
  if (name[0] == ':') return false;
  switch (name.size()) {
    case 7:
      return !(iequals(name, "upgrade") && protocol != Protocol::kHttp1);
    case 10:
      if (iequals(name, "keep-alive")) return false;
      if (iequals(name, "connection")) return upgrade && protocol == Protocol::kHttp1;
      return true;
    case 14:
      return !iequals(name, "content-length");
    case 16:
      return !iequals(name, "proxy-connection");
    case 17:
      return !iequals(name, "transfer-encoding");
    default:
      return true;
  }
}

// A route's Content-Length, when it is a plain decimal (what a proxy relays for HEAD).
std::optional<uint64_t> route_length(const Response& r) {
  auto v = r.find_header("content-length");
  if (!v || v->empty() || v->size() > 19) return std::nullopt;
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
  if (ec != std::errc() || end != v->data() + v->size()) return std::nullopt;
  return n;
}

// `r`'s headers passed field_refused() in plan_response() (a Response planned in their place, a
// 500, has none).
void add_route_fields(const Response& r, const PlanContext& ctx, bool upgrade, PlanFields& out) {
  for (const auto& [k, v] : r.headers)
    if (route_field_sent(k, ctx.protocol, upgrade)) out.add(k, v);
}

}  // namespace

void PlanFields::add_overflow(std::string_view name, std::string_view value) {
  if (overflow_.empty()) {
    overflow_.reserve(2 * kInlineFields);
    overflow_.assign(inline_.begin(), inline_.end());
  }
  overflow_.push_back({name, value});
  ++size_;
}

std::optional<std::string_view> PlanFields::find(std::string_view name) const {
  for (const Field& f : *this)
    if (iequals(f.name, name)) return f.value;
  return std::nullopt;
}

std::vector<FileSegment> file_segments(const ResolvedFile& f) {
  std::vector<FileSegment> out;
  if (!f.fd.valid() || f.content_length == 0) return out;
  if (f.parts.empty()) {
    ByteRange whole{0, f.size ? f.size - 1 : 0};
    ByteRange r = f.ranges.empty() ? whole : f.ranges.front();
    out.push_back({{}, r.first, r.length()});
    return out;
  }
  out.reserve(2 * f.parts.size() + 1);
  for (const auto& part : f.parts) {
    out.push_back({part.head, 0, 0});
    out.push_back({{}, part.range.first, part.range.length()});
  }
  out.push_back({f.tail, 0, 0});
  return out;
}

std::string ResponsePlan::take_bytes() {
  if (!owned_bytes.empty() && bytes.data() == owned_bytes.data()) {
    bytes = {};
    return std::move(owned_bytes);
  }
  return std::string(bytes);
}

void ResponsePlan::release_file() {
  file = ResolvedFile{};
  file_used_ = false;
}

void ResponsePlan::reset() {
  status = 200;
  fields.clear();
  framing_at = 0;
  content_length.reset();
  send_body = false;
  close = false;
  body = BodyKind::kNone;
  bytes = {};
  // A heap buffer is freed, not kept for the next response: a connection may stay idle for long.
  if (owned_bytes.capacity() > std::string().capacity()) {
    std::string().swap(owned_bytes);
  } else {
    owned_bytes.clear();
  }
  if (file_used_) release_file();
  producer.reset();
  deferred.reset();
  upgrade.reset();
  refused_header = {};
}

namespace {

// The head every response but a 101 carries, around the route's fields: Server, Date, Alt-Svc,
// Content-Type, (the framing), nosniff, Referrer-Policy, the route's, the resolver's `extra`, and
// the CSP of HTML. The order is the one HTTP/1.1 has always written.
void add_head_fields(const Response& r, Request& req, const PlanContext& ctx,
                     std::string_view content_type, const ResolvedFile* extra,
                     std::array<char, 256>& csp, ResponsePlan& plan) {
  auto& f = plan.fields;
  f.add("Server", ctx.server_name);
  f.add("Date", ctx.date);
  if (!ctx.alt_svc.empty()) f.add("Alt-Svc", ctx.alt_svc);
  if (!content_type.empty()) f.add("Content-Type", content_type);
  plan.framing_at = f.size();
  f.add("X-Content-Type-Options", kNosniff);
  f.add("Referrer-Policy", ctx.referrer_policy);
  add_route_fields(r, ctx, false, f);
  if (extra) {
    // The file resolver's fields (Content-Range, Last-Modified, ETag, ...) and a directory's
    // Location, which is built from the request's path: checked like a route's, so no protocol
    // relies on its parser to have refused CR, LF or NUL in a path (HTTP/3's does not).
    for (const auto& [k, v] : extra->headers)
      if (field_safe(k) && field_safe(v)) f.add(k, v);
    if (!extra->location.empty() && field_safe(extra->location)) f.add("Location", extra->location);
  }
  if (wants_default_csp(req.has_csp_nonce(), r)) {
    FixedText text{csp.data(), csp.size()};
    append_default_csp(text, req.csp_nonce());
    f.add("Content-Security-Policy", {csp.data(), text.size});
  }
}

void plan_file(Response& r, Request& req, const PlanContext& ctx, std::array<char, 256>& csp,
               ResponsePlan& plan) {
  ResolvedFile& f = plan.file;
  f = resolve_file(req, std::get<FileSpec>(r.body));
  plan.status = f.status;
  const bool head = req.method == Method::kHead;
  if (f.status >= 400 && !f.fd.valid()) {
    // 403/404/412/500 get a short text body; 416 none (its Content-Range says why).
    if (f.status == 416) {
      plan.content_length = 0;
      add_head_fields(r, req, ctx, {}, &f, csp, plan);
      return;
    }
    plan.body = BodyKind::kBytes;
    plan.bytes = reason_line(f.status);
    plan.content_length = plan.bytes.size();
    plan.send_body = !head;
    add_head_fields(r, req, ctx, kTextPlain, &f, csp, plan);
    return;
  }
  // 200/206 (HEAD: the length a GET would have), 301 to the directory, 304 without a length.
  if (f.status != 304) plan.content_length = f.content_length;
  add_head_fields(r, req, ctx, f.content_type, &f, csp, plan);
  if (f.fd.valid() && f.content_length > 0 && !head) {
    plan.body = BodyKind::kFile;
    plan.send_body = true;
  }
}

void plan_described(Response& r, Request& req, const PlanContext& ctx, std::array<char, 256>& csp,
                    ResponsePlan& plan) {
  plan.status = r.status;
  plan.close = !ctx.keep_alive;
  const bool head = req.method == Method::kHead;
  const bool no_body_status = r.status == 204 || r.status == 304 || r.status < 200;

  if (auto* up = std::get_if<UpgradeBody>(&r.body); up && up->handler) {
    // 101: Server, Date and the route's fields (Upgrade, Connection...), no framing, no defaults
    // meant for a body; the connection stays open for its new owner.
    plan.status = 101;
    plan.close = false;
    plan.fields.add("Server", ctx.server_name);
    plan.fields.add("Date", ctx.date);
    plan.framing_at = plan.fields.size();
    add_route_fields(r, ctx, true, plan.fields);
    plan.body = BodyKind::kUpgrade;
    plan.upgrade = std::move(up->handler);
    return;
  }
  if (auto* d = std::get_if<DeferredBody>(&r.body); d && d->producer) {
    plan.body = BodyKind::kDeferred;  // the head comes with the Responder's response
    plan.deferred = std::move(d->producer);
    return;
  }
  if (std::holds_alternative<UpgradeBody>(r.body) || std::holds_alternative<DeferredBody>(r.body)) {
    Response err = Response::status_only(500);  // a handler or producer that is not there
    plan_described(err, req, ctx, csp, plan);
    return;
  }
  if (std::holds_alternative<FileSpec>(r.body)) {
    plan_file(r, req, ctx, csp, plan);
    return;
  }

  if (r.is_html()) req.csp_nonce();  // the CSP of an HTML response carries a fresh nonce
  plan.send_body = !head && !no_body_status;
  if (auto* text = std::get_if<std::string>(&r.body)) {
    plan.body = BodyKind::kBytes;
    plan.owned_bytes = std::move(*text);
    plan.bytes = plan.owned_bytes;
    if (!no_body_status) plan.content_length = plan.bytes.size();
  } else if (auto* stream = std::get_if<StreamBody>(&r.body)) {
    plan.body = BodyKind::kStream;
    plan.producer = std::move(stream->producer);
    plan.content_length = stream->length;
  } else if (!no_body_status) {
    // No body: Content-Length 0, or for HEAD the length the route announces (a relayed HEAD).
    auto announced = head ? route_length(r) : std::nullopt;
    plan.content_length = announced ? *announced : 0;
  }
  add_head_fields(r, req, ctx, r.content_type(), nullptr, csp, plan);
}

}  // namespace

void plan_response(Response& r, Request& req, const PlanContext& ctx, ResponsePlan& plan) {
  for (const auto& [k, v] : r.headers) {
    if (!field_refused(k, v)) continue;
    plan.refused_header = k;
    Response err = Response::status_only(500);
    plan_described(err, req, ctx, plan.csp_, plan);
    return;
  }
  plan.file_used_ = std::holds_alternative<FileSpec>(r.body);
  plan_described(r, req, ctx, plan.csp_, plan);
}

}  // namespace corral::http
