// h3_rawclient: a QUIC v1 client (ngtcp2 0.12 + GnuTLS) that speaks just enough HTTP/3 by hand to
// send what gtlsclient never sends. After the handshake it opens its control stream (SETTINGS),
// then request stream 0 closed at once with no HEADERS (RFC 9114 §4.1: a stream error,
// H3_REQUEST_INCOMPLETE), then request stream 4 with `GET /whoami` (QPACK static table and
// literals only), then request stream 8 with `POST /upload` declaring `content-length:
// 1000000000` and never sending a byte of that body nor a FIN (a limit must answer from the
// head alone). It prints what the server does with each stream:
//   "stream <id> reset 0x<code>", "stream <id> body <text>", "stream <id> closed [0x<code>]"
//   (a server's STOP_SENDING shows as the close of a stream whose sending side we never ended),
//   "connection closed 0x<code>" (and exits 1), then exits 0 once stream 0 was reset, streams 4
//   and 8 answered and stream 8 closed, 2 after 10 s. It does not verify the certificate (a test
//   tool).
// Usage: h3_rawclient HOST PORT
#include <arpa/inet.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <netdb.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>

namespace {

constexpr const char* kPriority =
    "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:"
    "+AES-256-GCM:+CHACHA20-POLY1305:+AES-128-CCM:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1:"
    "+GROUP-SECP384R1:+GROUP-SECP521R1";

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Outgoing {
  std::string data;
  size_t off = 0;
  bool fin = false;
  bool done = false;
};

struct Client {
  int fd = -1;
  sockaddr_storage local{}, remote{};
  socklen_t local_len = 0, remote_len = 0;
  ngtcp2_conn* conn = nullptr;
  gnutls_session_t session = nullptr;
  gnutls_certificate_credentials_t cred = nullptr;
  ngtcp2_crypto_conn_ref ref{};
  bool handshake_done = false;
  bool streams_opened = false;
  std::map<int64_t, Outgoing> out;
  std::map<int64_t, std::string> in;
  bool reset0 = false;
  bool answered4 = false;
  bool answered8 = false;
  bool closed8 = false;  // both ways: our side ends only when the server stops our sending
};

void rand_cb(uint8_t* dest, size_t len, const ngtcp2_rand_ctx*) {
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, dest, len);
}

int new_cid_cb(ngtcp2_conn*, ngtcp2_cid* cid, uint8_t* token, size_t cidlen, void*) {
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, cid->data, cidlen);
  cid->datalen = cidlen;
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN);
  return 0;
}

int handshake_completed_cb(ngtcp2_conn*, void* ud) {
  static_cast<Client*>(ud)->handshake_done = true;
  return 0;
}

int stream_reset_cb(ngtcp2_conn*, int64_t sid, uint64_t, uint64_t code, void* ud, void*) {
  std::printf("stream %lld reset 0x%llx\n", static_cast<long long>(sid),
              static_cast<unsigned long long>(code));
  if (sid == 0) static_cast<Client*>(ud)->reset0 = true;
  return 0;
}

// A stream closed both ways. Stream 8's sending side never ends by itself (no FIN): it closes
// when the server's STOP_SENDING makes ngtcp2 reset it, with the code the server gave.
int stream_close_cb(ngtcp2_conn*, uint32_t flags, int64_t sid, uint64_t code, void* ud, void*) {
  if (flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET) {
    std::printf("stream %lld closed 0x%llx\n", static_cast<long long>(sid),
                static_cast<unsigned long long>(code));
  } else {
    std::printf("stream %lld closed\n", static_cast<long long>(sid));
  }
  if (sid == 8) static_cast<Client*>(ud)->closed8 = true;
  return 0;
}

// The DATA payloads of an HTTP/3 response stream (HEADERS and other frames skipped).
bool read_varint(const std::string& s, size_t& pos, uint64_t& v) {
  if (pos >= s.size()) return false;
  size_t n = size_t{1} << (static_cast<uint8_t>(s[pos]) >> 6);
  if (pos + n > s.size()) return false;
  v = static_cast<uint8_t>(s[pos]) & 0x3f;
  for (size_t i = 1; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(s[pos + i]);
  pos += n;
  return true;
}

std::string body_of(const std::string& stream) {
  std::string body;
  size_t pos = 0;
  uint64_t type = 0, len = 0;
  while (read_varint(stream, pos, type) && read_varint(stream, pos, len)) {
    if (pos + len > stream.size()) break;
    if (type == 0x0) body.append(stream, pos, len);
    pos += len;
  }
  return body;
}

int recv_stream_data_cb(ngtcp2_conn* conn, uint32_t flags, int64_t sid, uint64_t,
                        const uint8_t* data, size_t len, void* ud, void*) {
  auto* c = static_cast<Client*>(ud);
  c->in[sid].append(reinterpret_cast<const char*>(data), len);
  ngtcp2_conn_extend_max_stream_offset(conn, sid, len);
  ngtcp2_conn_extend_max_offset(conn, len);
  if ((flags & NGTCP2_STREAM_DATA_FLAG_FIN) && ngtcp2_is_bidi_stream(sid)) {
    std::string body = body_of(c->in[sid]);
    while (!body.empty() && body.back() == '\n') body.pop_back();
    std::printf("stream %lld body %s\n", static_cast<long long>(sid), body.c_str());
    if (sid == 4) c->answered4 = true;
    if (sid == 8) c->answered8 = true;
  }
  return 0;
}

ngtcp2_conn* get_conn(ngtcp2_crypto_conn_ref* ref) {
  return static_cast<Client*>(ref->user_data)->conn;
}

// A HEADERS frame: `method` is a QPACK static index (17 GET, 20 POST); a non-empty
// `content_length` adds that field.
std::string headers_frame(const std::string& authority, const std::string& path, int method = 17,
                          const std::string& content_length = "") {
  std::string f;
  f += '\0';                              // Required Insert Count 0
  f += '\0';                              // Base 0
  f += static_cast<char>(0xC0 | method);  // :method (static)
  f += static_cast<char>(0xC0 | 23);      // :scheme https (static 23)
  f += static_cast<char>(0x50 | 0);       // :authority, literal value (static name 0)
  f += static_cast<char>(authority.size());
  f += authority;
  f += static_cast<char>(0x50 | 1);  // :path, literal value (static name 1)
  f += static_cast<char>(path.size());
  f += path;
  if (!content_length.empty()) {
    f += static_cast<char>(0x50 | 4);  // content-length, literal value (static name 4)
    f += static_cast<char>(content_length.size());
    f += content_length;
  }
  std::string frame;
  frame += '\x01';  // HEADERS
  frame += static_cast<char>(f.size());
  return frame + f;
}

bool send_packets(Client& c) {
  uint8_t buf[1452];
  for (;;) {
    ngtcp2_path_storage ps;
    ngtcp2_path_storage_zero(&ps);
    ngtcp2_pkt_info pi;
    int64_t sid = -1;
    ngtcp2_vec vec{};
    size_t nvec = 0;
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_NONE;
    Outgoing* o = nullptr;
    for (auto& [id, st] : c.out) {
      if (st.done) continue;
      sid = id;
      o = &st;
      if (st.off < st.data.size()) {
        vec.base = reinterpret_cast<uint8_t*>(st.data.data() + st.off);
        vec.len = st.data.size() - st.off;
        nvec = 1;
      }
      if (st.fin) flags |= NGTCP2_WRITE_STREAM_FLAG_FIN;
      break;
    }
    ngtcp2_ssize ndatalen = -1;
    auto n = ngtcp2_conn_writev_stream(c.conn, &ps.path, &pi, buf, sizeof buf, &ndatalen, flags,
                                       sid, &vec, nvec, now_ns());
    if (n < 0) {
      std::printf("write error %s\n", ngtcp2_strerror(static_cast<int>(n)));
      return false;
    }
    if (o && ndatalen >= 0) {
      o->off += static_cast<size_t>(ndatalen);
      if (o->off == o->data.size() && (o->fin || o->data.size() > 0)) o->done = true;
    }
    if (n == 0) return true;
    (void)send(c.fd, buf, static_cast<size_t>(n), 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: h3_rawclient HOST PORT\n");
    return 64;
  }
  Client c;
  addrinfo hints{}, *ai = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(argv[1], argv[2], &hints, &ai) != 0 || !ai) return 64;
  c.fd = socket(ai->ai_family, SOCK_DGRAM, 0);
  memcpy(&c.remote, ai->ai_addr, ai->ai_addrlen);
  c.remote_len = ai->ai_addrlen;
  freeaddrinfo(ai);
  if (c.fd < 0 || connect(c.fd, reinterpret_cast<sockaddr*>(&c.remote), c.remote_len) != 0)
    return 1;
  c.local_len = sizeof c.local;
  getsockname(c.fd, reinterpret_cast<sockaddr*>(&c.local), &c.local_len);

  ngtcp2_callbacks cb{};
  cb.client_initial = ngtcp2_crypto_client_initial_cb;
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = ngtcp2_crypto_decrypt_cb;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.recv_retry = ngtcp2_crypto_recv_retry_cb;
  cb.update_key = ngtcp2_crypto_update_key_cb;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb.rand = rand_cb;
  cb.get_new_connection_id = new_cid_cb;
  cb.handshake_completed = handshake_completed_cb;
  cb.stream_reset = stream_reset_cb;
  cb.stream_close = stream_close_cb;
  cb.recv_stream_data = recv_stream_data_cb;

  ngtcp2_cid dcid, scid;
  dcid.datalen = 18;
  scid.datalen = 17;
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, dcid.data, dcid.datalen);
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, scid.data, scid.datalen);
  ngtcp2_settings settings;
  ngtcp2_settings_default(&settings);
  settings.initial_ts = now_ns();
  ngtcp2_transport_params params;
  ngtcp2_transport_params_default(&params);
  params.initial_max_streams_uni = 3;
  params.initial_max_stream_data_bidi_local = 256 * 1024;
  params.initial_max_stream_data_uni = 256 * 1024;
  params.initial_max_data = 1024 * 1024;
  params.max_idle_timeout = 10 * NGTCP2_SECONDS;
  ngtcp2_path path{};
  path.local.addr = reinterpret_cast<ngtcp2_sockaddr*>(&c.local);
  path.local.addrlen = c.local_len;
  path.remote.addr = reinterpret_cast<ngtcp2_sockaddr*>(&c.remote);
  path.remote.addrlen = c.remote_len;
  if (ngtcp2_conn_client_new(&c.conn, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb, &settings,
                             &params, nullptr, &c) != 0)
    return 1;

  if (gnutls_init(&c.session, GNUTLS_CLIENT | GNUTLS_NO_END_OF_EARLY_DATA) != 0) return 1;
  if (gnutls_priority_set_direct(c.session, kPriority, nullptr) != 0) return 1;
  if (ngtcp2_crypto_gnutls_configure_client_session(c.session) != 0) return 1;
  c.ref.get_conn = get_conn;
  c.ref.user_data = &c;
  gnutls_session_set_ptr(c.session, &c.ref);
  gnutls_certificate_allocate_credentials(&c.cred);
  gnutls_credentials_set(c.session, GNUTLS_CRD_CERTIFICATE, c.cred);
  gnutls_datum_t alpn{const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>("h3")), 2};
  gnutls_alpn_set_protocols(c.session, &alpn, 1, GNUTLS_ALPN_MANDATORY);
  gnutls_server_name_set(c.session, GNUTLS_NAME_DNS, "localhost", 9);
  ngtcp2_conn_set_tls_native_handle(c.conn, c.session);

  const std::string authority = std::string("localhost:") + argv[2];
  const uint64_t deadline = now_ns() + 10 * NGTCP2_SECONDS;
  int rc = 2;
  if (!send_packets(c)) rc = 1;
  while (rc == 2 && now_ns() < deadline) {
    if (c.handshake_done && !c.streams_opened) {
      c.streams_opened = true;
      int64_t ctrl = -1, s0 = -1, s4 = -1, s8 = -1;
      if (ngtcp2_conn_open_uni_stream(c.conn, &ctrl, nullptr) != 0 ||
          ngtcp2_conn_open_bidi_stream(c.conn, &s0, nullptr) != 0 ||
          ngtcp2_conn_open_bidi_stream(c.conn, &s4, nullptr) != 0 ||
          ngtcp2_conn_open_bidi_stream(c.conn, &s8, nullptr) != 0) {
        std::printf("cannot open streams\n");
        rc = 1;
        break;
      }
      c.out[ctrl].data = std::string("\x00\x04\x00", 3);  // control stream: SETTINGS {}
      c.out[s0].fin = true;                               // no HEADERS, FIN at once
      c.out[s4].data = headers_frame(authority, "/whoami");
      c.out[s4].fin = true;
      c.out[s8].data = headers_frame(authority, "/upload", 20, "1000000000");  // no body, no FIN
    }
    if (!send_packets(c)) {
      rc = 1;
      break;
    }
    if (c.reset0 && c.answered4 && c.answered8 && c.closed8) {
      rc = 0;
      break;
    }
    uint64_t expiry = ngtcp2_conn_get_expiry(c.conn);
    uint64_t now = now_ns();
    int wait_ms =
        expiry <= now ? 0 : static_cast<int>(std::min<uint64_t>((expiry - now) / 1000000 + 1, 100));
    pollfd p{c.fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) > 0) {
      uint8_t buf[65536];
      ssize_t n = recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        ngtcp2_pkt_info pi{};
        int rv = ngtcp2_conn_read_pkt(c.conn, &path, &pi, buf, static_cast<size_t>(n), now_ns());
        if (rv == NGTCP2_ERR_DRAINING || rv == NGTCP2_ERR_CLOSING) {
          ngtcp2_connection_close_error err;
          ngtcp2_conn_get_connection_close_error(c.conn, &err);
          std::printf("connection closed 0x%llx\n",
                      static_cast<unsigned long long>(err.error_code));
          rc = 1;
        } else if (rv != 0) {
          std::printf("read error %s\n", ngtcp2_strerror(rv));
          rc = 1;
        }
      }
    } else if (ngtcp2_conn_get_expiry(c.conn) <= now_ns()) {
      if (int rv = ngtcp2_conn_handle_expiry(c.conn, now_ns()); rv != 0) {
        std::printf("timeout %s\n", ngtcp2_strerror(rv));
        rc = 1;
      }
    }
  }
  if (rc == 2) std::printf("no answer in 10 s\n");
  std::fflush(stdout);
  ngtcp2_conn_del(c.conn);
  gnutls_deinit(c.session);
  gnutls_certificate_free_credentials(c.cred);
  close(c.fd);
  return rc;
}
