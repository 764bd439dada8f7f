// Admission: the security baseline every request passes before any application code runs. It is a
// pure function (sans-IO) of the parsed request head, the peer's address and a policy: it refuses
// dangerous methods (TRACE, TRACK, CONNECT), targets that are not a clean origin-form
// (absolute-form, dot-segments, bad escapes, NUL, fragments), a missing, duplicated or malformed
// Host, a Host that is not allowed (DNS-rebinding protection: loopback names are always allowed,
// anything else must be listed), and forwarding headers from a peer that is not a configured relay.
// On success it fills req.host, req.remote_address and (when a relay says so) req.scheme.
//
// Lifetime and threading: an AdmissionPolicy is an immutable value. The server builds a new one on
// a configuration change and swaps a shared_ptr<const AdmissionPolicy>; a connection keeps the
// pointer it started the request with, and still_admitted() decides whether an open connection
// must be closed because its host was removed. Nothing here allocates on the common path (a
// loopback GET with a plain Host and no forwarding headers); admit() never throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/socket.h"
#include "http/request.h"

namespace corral::http {

// An IPv4 or IPv6 address in binary form, parsed and formatted without allocating.
struct IpAddress {
  static constexpr size_t kMaxText = 46;  // INET6_ADDRSTRLEN

  int family = 0;          // AF_INET, AF_INET6; 0 for none
  uint8_t bytes[16] = {};  // network order; IPv4 uses the first 4

  // A strict dotted quad ("127.0.0.1"; no leading zeros, no short forms) or an IPv6 address
  // without brackets or zone ("::1"). Anything else is nullopt.
  static std::optional<IpAddress> parse(std::string_view text);
  // The peer of a socket; an IPv4-mapped IPv6 address ("::ffff:10.0.0.1") becomes IPv4.
  static IpAddress from(const core::SocketAddress& addr);
  // The canonical text ("10.0.0.1", "2001:db8::1") written into buf.
  std::string_view format(char (&buf)[kMaxText]) const;
  bool operator==(const IpAddress& o) const;
};

// The peer of a connection, computed once per connection (admit() then copies its text into
// req.remote_address, which reuses the request's capacity).
struct Peer {
  IpAddress ip;

  static Peer from(const core::SocketAddress& addr);
  std::string_view text() const { return {text_, text_len_}; }

 private:
  char text_[IpAddress::kMaxText] = {};
  uint8_t text_len_ = 0;
};

// A trusted reverse proxy: one address or a CIDR prefix, IPv4 or IPv6. An IPv4 relay also matches
// the same address seen as IPv4-mapped IPv6 on a dual-stack socket.
struct Relay {
  IpAddress network;  // the host bits beyond prefix_len are zero
  uint8_t prefix_len = 0;

  bool contains(const IpAddress& ip) const;
};

// "127.0.0.1", "10.0.0.0/8", "::1", "[::1]", "fd00::/8". Host bits set beyond the prefix
// ("10.1.0.0/8") are an error rather than silently masked: the operator probably meant otherwise.
core::Result<Relay> parse_relay(std::string_view text);

struct AdmissionPolicy {
  // Host names or IP literals, without port, compared case-insensitively (store them lowercase;
  // normalize_allowed_host() does). An IPv6 literal may be written "2001:db8::1" or
  // "[2001:db8::1]"; it matches the bracketed Host form "[2001:db8::1]" in any spelling of the
  // same address ("[2001:DB8:0::1]"). No wildcards.
  std::vector<std::string> allowed_hosts;
  std::vector<Relay> relays;

  // `host` is a Host header without its port ("example.com", "[::1]"). Loopback forms are always
  // allowed (see is_loopback_host).
  bool host_allowed(std::string_view host) const;
  bool is_relay(const IpAddress& ip) const;
};

// For configuration loading: a lowercase host name, or an IP literal (IPv6 bracketed and
// canonical, "[2001:db8::1]"). A port, a userinfo, whitespace or an empty string is an error.
core::Result<std::string> normalize_allowed_host(std::string_view text);

struct Admission {
  int status = 0;           // 0: admitted; else 400, 403 or 501 to answer, then close
  std::string_view reason;  // static text for the log line, e.g. "host not allowed"
  // Admitted, after dropping this many headers that spell a trusted header with '_' for '-'
  // (`Corral_Principal`, `x_forwarded_for`): the caller may log it.
  uint16_t dropped_headers = 0;

  bool admitted() const { return status == 0; }
};

// "example.com:8080" -> "example.com", "[::1]:8080" -> "[::1]", "example.com" -> itself.
std::string_view host_without_port(std::string_view host);
// "localhost" (any case), any strict 127.0.0.0/8 dotted quad, and "[::1]" (any spelling).
bool is_loopback_host(std::string_view host_without_port);
// RFC 3986 host [":" port] as a Host header carries it: reg-name (unreserved, sub-delims,
// pct-encoded), IPv4, or "[IPv6]" (no IPvFuture, no zone); port 1-5 digits, at most 65535.
// Empty, userinfo ('@'), whitespace or an empty port ("example.com:") are invalid.
bool valid_host(std::string_view host);

// The checks, in order: method (501), target (403 absolute-form, else 400), Host (400 syntax,
// 403 not allowed), forwarding headers (403 from a non-relay, 400 malformed from a relay). Headers
// whose name, with '_' read as '-', case-insensitively is a trusted one (Corral-*, Forwarded,
// X-Forwarded-*, X-Real-IP) are removed from req.headers, whoever sent them. Fills
// req.path and req.query from req.target when the caller left req.path empty. An HTTP/1.0 request
// without Host is admitted with an empty req.host: every browser sends Host, so a DNS-rebinding
// page cannot use this to reach us.
Admission admit(Request& req, const Peer& peer, const AdmissionPolicy& policy);
Admission admit(Request& req, const core::SocketAddress& peer, const AdmissionPolicy& policy);

// Behind corral's proxy (ServerOptions::behind_corral, a worker's socket): the client's Host and
// scheme as the proxy passed them in Corral-Host and Corral-Scheme become req.host and
// req.scheme. A field that is absent, or not a valid Host / not "http" or "https", changes
// nothing. Returns the request's Corral-Seq value (empty if none): the proxy's sequence number,
// which the response echoes (docs/worker-protocol.md, "Pipelining").
std::string_view take_corral_view(Request& req);

// Whether a connection admitted for `admitted_host` (req.host, port included) may stay open under
// a new policy. An empty host (HTTP/1.0 without Host) stays admitted.
bool still_admitted(std::string_view admitted_host, const AdmissionPolicy& policy);

}  // namespace corral::http
