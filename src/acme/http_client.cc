#include "acme/http_client.h"

#include <gnutls/gnutls.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "core/unique_fd.h"

namespace corral::acme {

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

core::Error bad(const char* why) {
  return core::Error{EPROTO, why};
}

core::Result<std::string> dechunk(std::string_view in) {
  std::string out;
  for (;;) {
    size_t eol = in.find("\r\n");
    if (eol == std::string_view::npos) return bad("truncated chunk size");
    std::string_view line = in.substr(0, eol);
    if (auto semi = line.find(';'); semi != std::string_view::npos) line = line.substr(0, semi);
    line = trim(line);
    if (line.empty() || line.size() > 8) return bad("bad chunk size");
    size_t n = 0;
    for (char c : line) {
      int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
              : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
              : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                          : -1;
      if (v < 0) return bad("bad chunk size");
      n = n * 16 + static_cast<size_t>(v);
    }
    in.remove_prefix(eol + 2);
    if (n == 0) return out;  // trailers ignored
    if (in.size() < n + 2) return bad("truncated chunk");
    out.append(in.substr(0, n));
    in.remove_prefix(n + 2);
  }
}

struct Url {
  bool tls = true;
  std::string host;
  std::string port;
  std::string target;
};

core::Result<Url> parse_url(const std::string& url) {
  Url u;
  std::string_view rest = url;
  if (rest.rfind("https://", 0) == 0) {
    rest.remove_prefix(8);
    u.port = "443";
  } else if (rest.rfind("http://", 0) == 0) {
    rest.remove_prefix(7);
    u.tls = false;
    u.port = "80";
  } else {
    return core::Error{EINVAL, "not an http(s) URL: " + url};
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  u.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (!authority.empty() && authority.front() == '[') {  // [v6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return core::Error{EINVAL, "bad URL host: " + url};
    u.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size() && authority[close + 1] == ':')
      u.port = std::string(authority.substr(close + 2));
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    u.host = std::string(authority.substr(0, colon));
    u.port = std::string(authority.substr(colon + 1));
  } else {
    u.host = std::string(authority);
  }
  if (u.host.empty()) return core::Error{EINVAL, "URL without a host: " + url};
  return u;
}

core::Result<core::UniqueFd> connect_to(const Url& u, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &res); rc != 0)
    return core::Error{EHOSTUNREACH, u.host + ": " + gai_strerror(rc)};
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(res, &freeaddrinfo);
  std::string why = "no address";
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  for (addrinfo* a = res; a; a = a->ai_next) {
    core::UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) continue;
    // Blocking with timeouts: every connect, send and recv below is bounded.
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0) return fd;
    why = std::strerror(errno);
  }
  return core::Error{ECONNREFUSED, fmt::format("connect {}:{}: {}", u.host, u.port, why)};
}

// One TLS client session over a connected blocking socket.
class ClientTls {
 public:
  ~ClientTls() {
    if (session_) gnutls_deinit(session_);
    if (cred_) gnutls_certificate_free_credentials(cred_);
  }
  core::Result<void> start(int fd, const Url& u, const HttpClientOptions& o) {
    int rc = gnutls_certificate_allocate_credentials(&cred_);
    if (rc == 0)
      rc = o.ca_file.empty() ? gnutls_certificate_set_x509_system_trust(cred_)
                             : gnutls_certificate_set_x509_trust_file(cred_, o.ca_file.c_str(),
                                                                      GNUTLS_X509_FMT_PEM);
    if (rc < 0) return core::Error{rc, "trust store " + o.ca_file + ": " + gnutls_strerror(rc)};
    rc = gnutls_init(&session_, GNUTLS_CLIENT);
    if (rc == 0) rc = gnutls_set_default_priority(session_);
    if (rc == 0) rc = gnutls_credentials_set(session_, GNUTLS_CRD_CERTIFICATE, cred_);
    if (rc == 0)
      rc = gnutls_server_name_set(session_, GNUTLS_NAME_DNS, u.host.data(), u.host.size());
    if (rc != 0) return core::Error{rc, std::string("tls client: ") + gnutls_strerror(rc)};
    gnutls_session_set_verify_cert(session_, u.host.c_str(), 0);
    gnutls_transport_set_int(session_, fd);
    do {
      rc = gnutls_handshake(session_);
    } while (rc < 0 && !gnutls_error_is_fatal(rc));
    if (rc < 0) {
      std::string why = gnutls_strerror(rc);
      if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        gnutls_datum_t out{};
        auto type = gnutls_certificate_type_get(session_);
        unsigned status = gnutls_session_get_verify_cert_status(session_);
        if (gnutls_certificate_verification_status_print(status, type, &out, 0) == 0) {
          why += fmt::format(" ({})", reinterpret_cast<const char*>(out.data));
          gnutls_free(out.data);
        }
      }
      return core::Error{rc, fmt::format("TLS to {}: {}", u.host, why)};
    }
    return {};
  }
  ssize_t send(const char* p, size_t n) {
    ssize_t r;
    do {
      r = gnutls_record_send(session_, p, n);
    } while (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED);
    return r;
  }
  // GnuTLS also answers AGAIN after a post-handshake message (TLS 1.3's session tickets): read
  // again, until `deadline` (the socket's own timeout gives AGAIN too).
  ssize_t recv(char* p, size_t n, std::chrono::steady_clock::time_point deadline) {
    ssize_t r;
    do {
      r = gnutls_record_recv(session_, p, n);
    } while (r == GNUTLS_E_INTERRUPTED ||
             (r == GNUTLS_E_AGAIN && std::chrono::steady_clock::now() < deadline));
    if (r == GNUTLS_E_PREMATURE_TERMINATION) return 0;
    return r;
  }

 private:
  gnutls_certificate_credentials_t cred_ = nullptr;
  gnutls_session_t session_ = nullptr;
};

}  // namespace

core::Result<Response> parse_response(std::string_view raw, bool head_only) {
  size_t end = raw.find("\r\n\r\n");
  if (end == std::string_view::npos) return bad("response head incomplete");
  std::string_view head = raw.substr(0, end);
  std::string_view body = raw.substr(end + 4);
  Response r;
  size_t eol = head.find("\r\n");
  std::string_view status_line = head.substr(0, eol);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12 || status_line[8] != ' ')
    return bad("bad status line");
  for (size_t i = 9; i < 12; ++i)
    if (!std::isdigit(static_cast<unsigned char>(status_line[i]))) return bad("bad status code");
  r.status = (status_line[9] - '0') * 100 + (status_line[10] - '0') * 10 + (status_line[11] - '0');
  bool chunked = false;
  long long length = -1;
  std::string_view rest = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
  while (!rest.empty()) {
    size_t next = rest.find("\r\n");
    std::string_view line = rest.substr(0, next);
    rest = next == std::string_view::npos ? std::string_view() : rest.substr(next + 2);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return bad("bad header line");
    std::string_view name = line.substr(0, colon);
    std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "location"))
      r.location = value;
    else if (iequals(name, "replay-nonce"))
      r.replay_nonce = value;
    else if (iequals(name, "retry-after"))
      r.retry_after = value;
    else if (iequals(name, "content-type"))
      r.content_type = value;
    else if (iequals(name, "transfer-encoding"))
      chunked = value.find("chunked") != value.npos;
    else if (iequals(name, "content-length")) {
      if (value.empty() || value.size() > 9) return bad("bad Content-Length");
      length = 0;
      for (char c : value) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return bad("bad Content-Length");
        length = length * 10 + (c - '0');
      }
    }
  }
  if (head_only || r.status == 204 || r.status == 304) return r;
  if (chunked) {
    auto b = dechunk(body);
    if (!b) return b.error();
    r.body = std::move(b.value());
  } else if (length >= 0) {
    if (body.size() < static_cast<size_t>(length)) return bad("response body truncated");
    r.body = std::string(body.substr(0, static_cast<size_t>(length)));
  } else {
    r.body = std::string(body);
  }
  return r;
}

core::Result<Response> http_request(const Request& request, const HttpClientOptions& options) {
  auto url = parse_url(request.url);
  if (!url) return url.error();
  auto fd = connect_to(url.value(), options.timeout_ms);
  if (!fd) return fd.error();
  const Url& u = url.value();
  std::string host = u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host;
  std::string out = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: corral-acme\r\nAccept: */*\r\n"
      "Connection: close\r\n",
      request.method, u.target, host, u.port);
  if (request.method == "POST")
    out += fmt::format("Content-Type: application/jose+json\r\nContent-Length: {}\r\n",
                       request.body.size());
  out += "\r\n";
  out += request.body;
  ClientTls tls;
  if (u.tls)
    if (auto r = tls.start(fd->get(), u, options); !r) return r.error();
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = u.tls ? tls.send(out.data() + off, out.size() - off)
                      : ::send(fd->get(), out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      return core::Error{EIO, fmt::format("send to {}: {}", u.host,
                                          n < 0 && !u.tls ? std::strerror(errno) : "failed")};
    off += static_cast<size_t>(n);
  }
  std::string in;
  char buf[16384];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  for (;;) {
    ssize_t n = u.tls ? tls.recv(buf, sizeof buf, deadline) : ::recv(fd->get(), buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (!u.tls && errno == EINTR) continue;
      return core::Error{
          EIO, fmt::format("read from {}: {}", u.host,
                           u.tls ? gnutls_strerror(static_cast<int>(n)) : std::strerror(errno))};
    }
    in.append(buf, static_cast<size_t>(n));
    if (in.size() > options.max_response)
      return core::Error{EMSGSIZE, "response from " + u.host + " too large"};
    // A HEAD's answer ends with its head (a server may keep the connection open anyway).
    if (request.method == "HEAD" && in.find("\r\n\r\n") != std::string::npos) break;
  }
  return parse_response(in, request.method == "HEAD");
}

}  // namespace corral::acme
