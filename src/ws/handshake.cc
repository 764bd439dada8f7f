#include "ws/handshake.h"

#include "http/text.h"

#include <nettle/sha1.h>

#include <cstring>

namespace corral::ws {

namespace {

constexpr char kGuid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// A valid key is base64 of exactly 16 bytes: 22 characters and "==".
bool valid_key(std::string_view k) {
  if (k.size() != 24 || k[22] != '=' || k[23] != '=') return false;
  for (size_t i = 0; i < 22; ++i)
    if (!std::strchr(kB64, k[i]) || k[i] == '\0') return false;
  // The last character carries 2 bits of data and 4 zero bits.
  const char* pos = std::strchr(kB64, k[21]);
  return ((pos - kB64) & 0x0f) == 0;
}

using http::trim_ows;

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string accept_key(std::string_view key) {
  std::string input(key);
  input += kGuid;
  uint8_t digest[SHA1_DIGEST_SIZE];
  sha1_ctx ctx;
  sha1_init(&ctx);
  sha1_update(&ctx, input.size(), reinterpret_cast<const uint8_t*>(input.data()));
  sha1_digest(&ctx, sizeof digest, digest);
  char out[28];
  return std::string(out, http::base64_encode(digest, sizeof digest, out));
}

Handshake check_handshake(const http::Request& req, const HandshakeOptions& options) {
  Handshake h;
  if (!req.headers.has_token("upgrade", "websocket") ||
      !req.headers.has_token("connection", "upgrade")) {
    h.status = 426;
    h.reason = "not a WebSocket upgrade";
    return h;
  }
  if (req.method != http::Method::kGet || req.version_major != 1 || req.version_minor != 1) {
    h.status = 400;
    h.reason = "a WebSocket upgrade must be GET over HTTP/1.1";
    return h;
  }
  if (req.headers.count("sec-websocket-version") != 1 ||
      req.header("sec-websocket-version") != "13") {
    h.status = 426;
    h.reason = "unsupported WebSocket version";
    return h;
  }
  auto key = req.header("sec-websocket-key");
  if (!key || req.headers.count("sec-websocket-key") != 1 || !valid_key(trim_ows(*key))) {
    h.status = 400;
    h.reason = "invalid Sec-WebSocket-Key";
    return h;
  }
  // Origin: a browser always sends it; a client without one is not a page on another site.
  if (auto origin = req.header("origin")) {
    if (req.headers.count("origin") != 1) {
      h.status = 403;
      h.reason = "several Origin headers";
      return h;
    }
    std::string o = lower(trim_ows(*origin));
    std::string own = std::string(req.scheme) + "://" + lower(req.host);
    bool ok = !req.host.empty() && o == own;
    for (const auto& a : options.allowed_origins) ok = ok || o == lower(a);
    if (!ok) {
      h.status = 403;
      h.reason = "Origin not allowed";
      return h;
    }
  }
  for (const auto& p : options.subprotocols) {
    if (req.headers.has_token("sec-websocket-protocol", p)) {
      h.protocol = p;
      break;
    }
  }
  if (options.deflate) {
    std::string offers;
    for (const auto& hd : req.headers) {
      if (!http::iequals(hd.name, "sec-websocket-extensions")) continue;
      if (!offers.empty()) offers += ", ";
      offers += hd.value;
    }
    if (!offers.empty()) h.deflate = negotiate_deflate(offers, h.extensions);
  }
  h.accept = accept_key(trim_ows(*key));
  return h;
}

http::Response refusal(const Handshake& h) {
  auto r = http::Response::status_only(h.status);
  if (h.status == 426) {
    r.header("Upgrade", "websocket");
    r.header("Sec-WebSocket-Version", "13");
  }
  return r;
}

}  // namespace corral::ws
