#include "http/admission.h"

#include "http/text.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <cstring>
#include <utility>

namespace corral::http {

namespace {

// Character classes (RFC 3986, RFC 7230), one bit each in a 256-entry table.
constexpr uint8_t kRegName = 1;  // unreserved / sub-delims
constexpr uint8_t kPath = 2;     // pchar without '%' (checked apart), plus '/'
constexpr uint8_t kQuery = 4;    // kPath plus '?' and the leftovers browsers send raw (below)
constexpr uint8_t kTchar = 8;    // token characters
constexpr uint8_t kHex = 16;
constexpr uint8_t kObf =
    32;  // obfuscated node characters (RFC 7239): ALPHA / DIGIT / "." / "_" / "-"

constexpr auto kClasses = [] {
  struct Table {
    uint8_t c[256] = {};
  } t;
  auto set = [&](std::string_view chars, uint8_t bit) {
    for (char ch : chars) t.c[static_cast<uint8_t>(ch)] |= bit;
  };
  constexpr std::string_view kAlnum =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  set(kAlnum, kRegName | kPath | kQuery | kTchar | kObf);
  set("-._~", kRegName | kPath | kQuery);
  set("!$&'()*+,;=", kRegName | kPath | kQuery);
  set(":@/", kPath | kQuery);
  set("?", kQuery);
  // The WHATWG URL standard leaves these unescaped in a query (fetch("/a?x=[1]") sends '[' raw),
  // so refusing them would refuse real browser traffic. A query takes no part in path traversal.
  set("[]{}|^`\\", kQuery);
  set("!#$%&'*+-.^_`|~", kTchar);
  set("0123456789abcdefABCDEF", kHex);
  set("._-", kObf);
  return t;
}();

bool is(char ch, uint8_t bit) {
  return kClasses.c[static_cast<uint8_t>(ch)] & bit;
}

// A valid "%HH" at s[i] that does not encode NUL.
bool valid_escape(std::string_view s, size_t i) {
  if (i + 2 >= s.size() || !is(s[i + 1], kHex) || !is(s[i + 2], kHex)) return false;
  return hex_digit_value(s[i + 1]) * 16 + hex_digit_value(s[i + 2]) != 0;
}

// "." or "..", also escaped ("%2e", ".%2E").
bool is_dot_segment(std::string_view seg) {
  size_t dots = 0;
  for (size_t i = 0; i < seg.size();) {
    if (seg[i] == '.') {
      ++dots, ++i;
    } else if (i + 2 < seg.size() && seg[i] == '%' && seg[i + 1] == '2' &&
               (seg[i + 2] | 0x20) == 'e') {
      ++dots, i += 3;
    } else {
      return false;
    }
  }
  return dots == 1 || dots == 2;
}

// scheme ":" where scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
bool looks_absolute(std::string_view t) {
  auto alpha = [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); };
  if (t.empty() || !alpha(t[0])) return false;
  for (size_t i = 1; i < t.size(); ++i) {
    char ch = t[i];
    if (ch == ':') return true;
    if (!alpha(ch) && !(ch >= '0' && ch <= '9') && ch != '+' && ch != '-' && ch != '.')
      return false;
  }
  return false;
}

constexpr Admission kOk{};
constexpr Admission bad(std::string_view why) {
  return {400, why};
}

Admission check_target(Request& req) {
  std::string_view t = req.target;
  if (t.empty()) return bad("empty target");
  if (t[0] != '/') {
    if (t == "*") {
      if (req.method != Method::kOptions) return bad("asterisk-form target without OPTIONS");
      if (req.path.empty()) req.path = t;
      return kOk;
    }
    if (looks_absolute(t)) return {403, "absolute-form target refused"};
    return bad("invalid request target");
  }
  size_t qmark = t.find('?');
  std::string_view path = t.substr(0, qmark);
  std::string_view query =
      qmark == std::string_view::npos ? std::string_view() : t.substr(qmark + 1);

  size_t segment_start = 1;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (i > 0 && is_dot_segment(path.substr(segment_start, i - segment_start)))
        return bad("dot-segment in path");
      segment_start = i + 1;
    } else if (path[i] == '%') {
      if (!valid_escape(path, i)) return bad("bad percent-escape in path");
      i += 2;
    } else if (!is(path[i], kPath)) {
      return path[i] == '#' ? bad("fragment in target") : bad("invalid character in path");
    }
  }
  for (size_t i = 0; i < query.size(); ++i) {
    if (query[i] == '%') {
      if (!valid_escape(query, i)) return bad("bad percent-escape in query");
      i += 2;
    } else if (!is(query[i], kQuery)) {
      return query[i] == '#' ? bad("fragment in target") : bad("invalid character in query");
    }
  }
  if (req.path.empty()) {
    req.path = path;
    req.query = query;
  }
  return kOk;
}

// 1-5 digits, at most 65535.
bool valid_port(std::string_view p) {
  if (p.empty() || p.size() > 5) return false;
  unsigned v = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  return ec == std::errc() && end == p.data() + p.size() && v <= 65535;
}

std::optional<IpAddress> parse_v4(std::string_view s) {
  IpAddress out;
  out.family = AF_INET;
  for (int part = 0; part < 4; ++part) {
    size_t n = 0;
    unsigned v = 0;
    while (n < s.size() && n < 4 && s[n] >= '0' && s[n] <= '9') v = v * 10 + (s[n++] - '0');
    if (n == 0 || n > 3 || v > 255 || (n > 1 && s[0] == '0')) return std::nullopt;
    out.bytes[part] = static_cast<uint8_t>(v);
    s.remove_prefix(n);
    if (part < 3) {
      if (s.empty() || s[0] != '.') return std::nullopt;
      s.remove_prefix(1);
    }
  }
  if (!s.empty()) return std::nullopt;
  return out;
}

std::optional<IpAddress> parse_v6(std::string_view s) {
  char buf[IpAddress::kMaxText];
  if (s.empty() || s.size() >= sizeof buf) return std::nullopt;
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  IpAddress out;
  if (inet_pton(AF_INET6, buf, out.bytes) != 1) return std::nullopt;
  out.family = AF_INET6;
  return out;
}

// "[v6]" -> the address inside; anything else -> nullopt.
std::optional<IpAddress> parse_bracketed_v6(std::string_view s) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  return parse_v6(s.substr(1, s.size() - 2));
}

constexpr std::string_view kForwardingHeaders[] = {
    "Forwarded", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP",
};

bool has_forwarding_header(const Headers& headers) {
  for (const auto& h : headers) {
    // Every forwarding header starts with 'f' or 'x': skip the rest without comparing.
    char first = static_cast<char>(h.name.empty() ? 0 : (h.name[0] | 0x20));
    if (first != 'f' && first != 'x') continue;
    for (auto name : kForwardingHeaders)
      if (iequals(h.name, name)) return true;
  }
  return false;
}

// Whether `name` contains '_' and, read with '_' as '-' and case-insensitively, names a header
// corral trusts: one it sets itself for a route or a worker (Corral-*: Corral-Principal,
// Corral-Remote-Address, Corral-Host, ...) or one a relay sets (Forwarded, X-Forwarded-*,
// X-Real-IP). CGI and WSGI map both '-' and '_' to '_' (HTTP_CORRAL_PRINCIPAL), so
// `Corral_Principal: admin` would otherwise pass as the trusted header behind our back.
bool disguised_trusted_header(std::string_view name) {
  if (name.find('_') == std::string_view::npos) return false;
  auto folded = [](char c) {
    if (c == '_') return '-';
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : c;
  };
  auto starts = [&](std::string_view prefix) {
    if (name.size() < prefix.size()) return false;
    for (size_t i = 0; i < prefix.size(); ++i)
      if (folded(name[i]) != prefix[i]) return false;
    return true;
  };
  auto equals = [&](std::string_view other) {
    return name.size() == other.size() && starts(other);
  };
  return starts("corral-") || starts("x-forwarded-") || equals("forwarded") || equals("x-real-ip");
}

// Drops every disguised trusted header; returns how many there were.
uint16_t drop_disguised_headers(Headers& headers) {
  auto& list = headers.list();
  size_t before = list.size();
  std::erase_if(list, [](const Header& h) { return disguised_trusted_header(h.name); });
  return static_cast<uint16_t>(before - list.size());
}

// What a relay said about the client.
struct ClientInfo {
  std::optional<IpAddress> address;  // none: keep the relay's own (unknown, obfuscated, absent)
  std::string_view scheme;           // "http", "https", or empty (not said)
};

// A node of RFC 7239 §6: nodename [ ":" node-port ], already unquoted.
// Returns false when invalid; `ip` stays empty for "unknown" and obfuscated names.
bool parse_node(std::string_view s, std::optional<IpAddress>& ip) {
  auto valid_node_port = [](std::string_view p) {
    if (!p.empty() && p[0] == '_') {
      if (p.size() == 1) return false;
      for (char ch : p.substr(1))
        if (!is(ch, kObf)) return false;
      return true;
    }
    return valid_port(p);
  };
  std::string_view name = s, port;
  bool has_port = false;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos) return false;
    name = s.substr(0, close + 1);
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      has_port = true, port = rest.substr(1);
    }
  } else if (size_t colon = s.find(':'); colon != std::string_view::npos) {
    name = s.substr(0, colon);
    has_port = true, port = s.substr(colon + 1);
  }
  if (name.empty() || (has_port && !valid_node_port(port))) return false;
  ip.reset();
  if (iequals(name, "unknown")) return true;
  if (!name.empty() && name[0] == '_') return valid_node_port(name);  // obfnode, same grammar
  ip = name[0] == '[' ? parse_bracketed_v6(name) : parse_v4(name);
  return ip.has_value();
}

std::optional<std::string_view> parse_proto(std::string_view v) {
  if (iequals(v, "https")) return "https";
  if (iequals(v, "http")) return "http";
  return std::nullopt;
}

// RFC 7239 Forwarded, over every Forwarded header line in order. Walking the elements from the
// right, elements whose for= is itself a relay are skipped (a chain of trusted proxies); the first
// other one describes the client. With one relay that is simply the last element.
bool parse_forwarded(const Headers& headers, const AdmissionPolicy& policy, ClientInfo& out) {
  ClientInfo chosen, first;
  bool have_chosen = false, have_first = false;
  char unquoted[128];  // a node or a proto is short; a longer quoted value is refused
  for (const auto& h : headers) {
    if (!iequals(h.name, "Forwarded")) continue;
    std::string_view v = h.value;
    size_t i = 0;
    while (i <= v.size()) {
      // One element: pairs separated by ';', ended by ',' or the end of the line.
      ClientInfo element;
      bool has_for = false, has_proto = false, has_by = false, has_host = false, empty = true;
      while (true) {
        while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
        if (i == v.size() || v[i] == ',') break;
        if (v[i] == ';') {
          ++i;
          continue;
        }
        size_t name_start = i;
        while (i < v.size() && is(v[i], kTchar)) ++i;
        std::string_view name = v.substr(name_start, i - name_start);
        if (name.empty() || i == v.size() || v[i] != '=') return false;
        ++i;
        std::string_view value;
        if (i < v.size() && v[i] == '"') {
          size_t n = 0;
          ++i;
          while (true) {
            if (i == v.size()) return false;  // unterminated
            char ch = v[i++];
            if (ch == '"') break;
            if (ch == '\\') {
              if (i == v.size()) return false;
              ch = v[i++];
            }
            if (n == sizeof unquoted) return false;
            unquoted[n++] = ch;
          }
          value = std::string_view(unquoted, n);
        } else {
          size_t value_start = i;
          while (i < v.size() && is(v[i], kTchar)) ++i;
          value = v.substr(value_start, i - value_start);
          if (value.empty()) return false;
        }
        while (i < v.size() && (v[i] == ' ' || v[i] == '\t')) ++i;
        if (i < v.size() && v[i] != ';' && v[i] != ',') return false;
        empty = false;
        // Each parameter at most once per element (RFC 7239 §4); extensions are ignored.
        auto once = [](bool& seen) { return !std::exchange(seen, true); };
        if (iequals(name, "for")) {
          if (!once(has_for) || !parse_node(value, element.address)) return false;
        } else if (iequals(name, "proto")) {
          auto p = parse_proto(value);
          if (!once(has_proto) || !p) return false;
          element.scheme = *p;
        } else if (iequals(name, "by")) {
          std::optional<IpAddress> ignored;
          if (!once(has_by) || !parse_node(value, ignored)) return false;
        } else if (iequals(name, "host")) {
          if (!once(has_host)) return false;
        }
      }
      if (!empty) {
        if (!have_first) first = element, have_first = true;
        if (!element.address || !policy.is_relay(*element.address))
          chosen = element, have_chosen = true;
      }
      ++i;  // past ',' (or past the end, which ends the line)
    }
  }
  if (have_chosen)
    out = chosen;
  else if (have_first)
    out = first;
  return true;
}

// One X-Forwarded-For / X-Real-IP entry: "1.2.3.4", "1.2.3.4:5678", "2001:db8::1", "[2001:db8::1]",
// "[2001:db8::1]:5678".
std::optional<IpAddress> parse_forwarded_ip(std::string_view s) {
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || !valid_port(rest.substr(1)))) return std::nullopt;
    return parse_bracketed_v6(s.substr(0, close + 1));
  }
  size_t colon = s.find(':');
  if (colon != std::string_view::npos && s.find(':', colon + 1) != std::string_view::npos)
    return parse_v6(s);
  if (colon != std::string_view::npos) {
    if (!valid_port(s.substr(colon + 1))) return std::nullopt;
    s = s.substr(0, colon);
  }
  return parse_v4(s);
}

// X-Forwarded-For over every line: like Forwarded, the rightmost entry that is not itself a relay
// (or the leftmost if all are). Only the chosen entry must be valid: the others came from the
// client or from proxies we do not trust, and are ignored either way.
bool parse_x_forwarded_for(const Headers& headers, const AdmissionPolicy& policy,
                           std::optional<IpAddress>& out) {
  std::optional<IpAddress> chosen, first;
  bool chosen_valid = true, first_valid = true, have_chosen = false, have_first = false;
  for (const auto& h : headers) {
    if (!iequals(h.name, "X-Forwarded-For")) continue;
    std::string_view v = h.value;
    while (true) {
      size_t comma = v.find(',');
      std::string_view entry = trim_ows(v.substr(0, comma));
      if (!entry.empty()) {
        auto ip = parse_forwarded_ip(entry);
        if (!have_first) first = ip, first_valid = ip.has_value(), have_first = true;
        if (!ip || !policy.is_relay(*ip))
          chosen = ip, chosen_valid = ip.has_value(), have_chosen = true;
      }
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  if (have_chosen) {
    out = chosen;
    return chosen_valid;
  }
  if (have_first) {
    out = first;
    return first_valid;
  }
  return true;
}

// The client as the relay described it; false when the description is malformed.
bool client_from_relay(const Headers& headers, const AdmissionPolicy& policy, ClientInfo& out) {
  if (headers.get("Forwarded")) return parse_forwarded(headers, policy, out);
  if (headers.get("X-Forwarded-For")) {
    if (!parse_x_forwarded_for(headers, policy, out.address)) return false;
  } else if (auto real_ip = headers.get("X-Real-IP")) {
    out.address = parse_forwarded_ip(trim_ows(*real_ip));
    if (!out.address) return false;
  }
  // X-Forwarded-Proto: the rightmost value, set by the nearest relay.
  std::optional<std::string_view> proto;
  for (const auto& h : headers)
    if (iequals(h.name, "X-Forwarded-Proto")) proto = h.value;
  if (proto) {
    std::string_view last = *proto;
    if (size_t comma = last.rfind(','); comma != std::string_view::npos)
      last = last.substr(comma + 1);
    auto p = parse_proto(trim_ows(last));
    if (!p) return false;
    out.scheme = *p;
  }
  return true;
}

}  // namespace

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
  if (text.find(':') != std::string_view::npos) return parse_v6(text);
  return parse_v4(text);
}

IpAddress IpAddress::from(const core::SocketAddress& addr) {
  IpAddress out;
  if (addr.family() == AF_INET) {
    out.family = AF_INET;
    std::memcpy(out.bytes, &reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr, 4);
  } else if (addr.family() == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      out.family = AF_INET;
      std::memcpy(out.bytes, a.s6_addr + 12, 4);
    } else {
      out.family = AF_INET6;
      std::memcpy(out.bytes, a.s6_addr, 16);
    }
  }
  return out;
}

std::string_view IpAddress::format(char (&buf)[kMaxText]) const {
  if (family != AF_INET && family != AF_INET6) return {};
  if (!inet_ntop(family, bytes, buf, sizeof buf)) return {};
  return buf;
}

bool IpAddress::operator==(const IpAddress& o) const {
  return family == o.family && std::memcmp(bytes, o.bytes, family == AF_INET ? 4 : 16) == 0;
}

Peer Peer::from(const core::SocketAddress& addr) {
  Peer p;
  p.ip = IpAddress::from(addr);
  p.text_len_ = static_cast<uint8_t>(p.ip.format(p.text_).size());
  return p;
}

bool Relay::contains(const IpAddress& ip) const {
  if (ip.family != network.family) return false;
  size_t full = prefix_len / 8;
  if (std::memcmp(ip.bytes, network.bytes, full) != 0) return false;
  if (unsigned rest = prefix_len % 8) {
    uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
    if ((ip.bytes[full] & mask) != network.bytes[full]) return false;
  }
  return true;
}

core::Result<Relay> parse_relay(std::string_view text) {
  auto fail = [&](std::string_view why) {
    return core::Error{EINVAL, "invalid relay '" + std::string(text) + "': " + std::string(why)};
  };
  std::string_view addr = text, prefix;
  size_t slash = text.find('/');
  if (slash != std::string_view::npos)
    addr = text.substr(0, slash), prefix = text.substr(slash + 1);
  std::optional<IpAddress> ip =
      !addr.empty() && addr[0] == '[' ? parse_bracketed_v6(addr) : IpAddress::parse(addr);
  if (!ip) return fail("expected an IP address or CIDR prefix (10.0.0.0/8, fd00::/8)");
  Relay r;
  r.network = *ip;
  unsigned max = ip->family == AF_INET ? 32 : 128;
  r.prefix_len = static_cast<uint8_t>(max);
  if (slash != std::string_view::npos) {
    unsigned len = 0;
    auto [end, ec] = std::from_chars(prefix.data(), prefix.data() + prefix.size(), len);
    if (prefix.empty() || ec != std::errc() || end != prefix.data() + prefix.size() || len > max)
      return fail("invalid prefix length");
    r.prefix_len = static_cast<uint8_t>(len);
  }
  Relay masked = r;
  for (unsigned bit = r.prefix_len; bit < max; ++bit)
    masked.network.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80u >> (bit % 8)));
  if (!(masked.network == r.network)) return fail("address bits set beyond the prefix length");
  return r;
}

bool AdmissionPolicy::is_relay(const IpAddress& ip) const {
  for (const auto& r : relays)
    if (r.contains(ip)) return true;
  return false;
}

bool AdmissionPolicy::host_allowed(std::string_view host) const {
  if (is_loopback_host(host)) return true;
  if (!host.empty() && host[0] == '[') {
    // An IPv6 literal: compare addresses, so every spelling of an allowed address matches.
    auto ip = parse_bracketed_v6(host);
    if (!ip) return false;
    for (std::string_view entry : allowed_hosts) {
      if (entry.find(':') == std::string_view::npos) continue;
      auto allowed = entry[0] == '[' ? parse_bracketed_v6(entry) : parse_v6(entry);
      if (allowed && *allowed == *ip) return true;
    }
    return false;
  }
  for (std::string_view entry : allowed_hosts)
    if (iequals(entry, host)) return true;
  return false;
}

core::Result<std::string> normalize_allowed_host(std::string_view text) {
  auto fail = [&](std::string_view why) {
    return core::Error{EINVAL,
                       "invalid allowed host '" + std::string(text) + "': " + std::string(why)};
  };
  if (text.find(':') != std::string_view::npos) {
    auto ip = !text.empty() && text[0] == '[' ? parse_bracketed_v6(text) : parse_v6(text);
    if (!ip) return fail("expected a host name or an IP address, without port");
    char buf[IpAddress::kMaxText];
    return "[" + std::string(ip->format(buf)) + "]";
  }
  if (!valid_host(text) || host_without_port(text) != text)
    return fail("expected a host name or an IP address, without port");
  std::string out(text);
  for (char& ch : out)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch | 0x20);
  return out;
}

std::string_view host_without_port(std::string_view host) {
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    return close == std::string_view::npos ? host : host.substr(0, close + 1);
  }
  return host.substr(0, host.find(':'));
}

bool is_loopback_host(std::string_view host) {
  if (iequals(host, "localhost")) return true;
  if (!host.empty() && host[0] == '[') {
    auto ip = parse_bracketed_v6(host);
    return ip && IN6_IS_ADDR_LOOPBACK(reinterpret_cast<const in6_addr*>(ip->bytes));
  }
  auto ip = parse_v4(host);
  return ip && ip->bytes[0] == 127;
}

bool valid_host(std::string_view host) {
  if (host.empty()) return false;
  std::string_view name = host_without_port(host);
  if (name.size() < host.size()) {
    if (host[name.size()] != ':' || !valid_port(host.substr(name.size() + 1))) return false;
  }
  if (name.empty()) return false;
  if (name[0] == '[') return parse_bracketed_v6(name).has_value();  // no IPvFuture, no zone
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%') {
      if (!valid_escape(name, i)) return false;
      i += 2;
    } else if (!is(name[i], kRegName)) {
      return false;
    }
  }
  return true;
}

Admission admit(Request& req, const Peer& peer, const AdmissionPolicy& policy) {
  // 1. Methods that only help attackers: TRACE/TRACK echo credentials back (cross-site tracing),
  // CONNECT would make us a tunnel.
  if (req.method == Method::kTrace || req.method == Method::kTrack ||
      req.method == Method::kConnect)
    return {501, "method not implemented"};

  // 2. The target.
  if (Admission a = check_target(req); !a.admitted()) return a;

  // 3. Host.
  size_t host_count = 0;
  std::string_view host;
  for (const auto& h : req.headers) {
    if (iequals(h.name, "Host")) {
      if (++host_count > 1) return bad("more than one Host header");
      host = h.value;
    }
  }
  bool host_required = req.version_major > 1 || (req.version_major == 1 && req.version_minor >= 1);
  if (host_count == 0) {
    if (host_required) return bad("missing Host header");
  } else {
    if (!valid_host(host)) return bad("invalid Host header");
    // The reason is the log's, never the client's (the body stays "Forbidden"): it names the
    // setting an operator who meant to serve this host is looking for.
    if (!policy.host_allowed(host_without_port(host)))
      return {403, "host not allowed: add it to allowed_hosts (or --allowed-host HOST)"};
  }

  // 4. Forwarding headers: only a relay may say who the client is. A trusted header spelt with
  // '_' for '-' is dropped (not refused: nginx ignores such names by default, so no legitimate
  // relay sends them, and a stray one need not cost the client its request).
  uint16_t dropped = drop_disguised_headers(req.headers);
  ClientInfo client;
  if (has_forwarding_header(req.headers)) {
    if (!policy.is_relay(peer.ip))
      return {403,
              "forwarded header from a non-relay: a proxy in front of corral goes in relays (or "
              "--relay ADDRESS/CIDR)"};
    if (!client_from_relay(req.headers, policy, client)) return bad("invalid forwarded header");
  }

  req.host = host;
  if (client.address) {
    char buf[IpAddress::kMaxText];
    req.remote_address.assign(client.address->format(buf));
  } else {
    req.remote_address.assign(peer.text());
  }
  if (!client.scheme.empty()) req.scheme = client.scheme;
  Admission ok = kOk;
  ok.dropped_headers = dropped;
  return ok;
}

Admission admit(Request& req, const core::SocketAddress& peer, const AdmissionPolicy& policy) {
  return admit(req, Peer::from(peer), policy);
}

std::string_view take_corral_view(Request& req) {
  // One pass, by length first: this runs for every request a worker serves.
  std::string_view seq;
  for (const auto& h : req.headers) {
    if (h.name.size() == 11 && iequals(h.name, "corral-host")) {
      if (valid_host(h.value)) req.host = h.value;
    } else if (h.name.size() == 13 && iequals(h.name, "corral-scheme")) {
      if (h.value == "https") req.scheme = "https";
      if (h.value == "http") req.scheme = "http";
    } else if (h.name.size() == 10 && iequals(h.name, "corral-seq")) {
      seq = h.value;
    }
  }
  return seq;
}

bool still_admitted(std::string_view admitted_host, const AdmissionPolicy& policy) {
  return admitted_host.empty() || policy.host_allowed(host_without_port(admitted_host));
}

}  // namespace corral::http
