#include "quic/h3_connection.h"

#include <fmt/format.h>
#include <gnutls/crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "http/metrics.h"
#include "http/server.h"
#include "http/site.h"
#include "quic/steering.h"

namespace corral::quic {

namespace {

// TLS 1.3 only, no middlebox-compatibility CCS (QUIC has none): what the ngtcp2 examples use.
constexpr const char* kPriority =
    "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:"
    "+AES-256-GCM:+CHACHA20-POLY1305:+AES-128-CCM:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1:"
    "+GROUP-SECP384R1:+GROUP-SECP521R1";

H3Connection* self(void* ud) {
  return static_cast<H3Connection*>(ud);
}

RequestHead::Pseudo pseudo_of(int32_t token, std::string_view name) {
  switch (token) {
    case NGHTTP3_QPACK_TOKEN__METHOD:
      return RequestHead::Pseudo::kMethod;
    case NGHTTP3_QPACK_TOKEN__SCHEME:
      return RequestHead::Pseudo::kScheme;
    case NGHTTP3_QPACK_TOKEN__AUTHORITY:
      return RequestHead::Pseudo::kAuthority;
    case NGHTTP3_QPACK_TOKEN__PATH:
      return RequestHead::Pseudo::kPath;
    case NGHTTP3_QPACK_TOKEN__PROTOCOL:
      return RequestHead::Pseudo::kProtocol;
    default:
      break;
  }
  if (!name.empty() && name[0] == ':') return RequestHead::Pseudo::kUnknown;
  return RequestHead::Pseudo::kNone;
}

int alpn_hook(gnutls_session_t session, unsigned int, unsigned int, unsigned int,
              const gnutls_datum_t*) {
  gnutls_datum_t alpn;
  if (gnutls_alpn_get_selected_protocol(session, &alpn) != 0) return -1;
  if (alpn.size != 2 || memcmp(alpn.data, "h3", 2) != 0) return -1;
  return 0;
}

ngtcp2_addr addr_of(const core::SocketAddress& a) {
  ngtcp2_addr r;
  r.addr = const_cast<ngtcp2_sockaddr*>(reinterpret_cast<const ngtcp2_sockaddr*>(&a.storage));
  r.addrlen = a.len;
  return r;
}

core::SocketAddress socket_address(const ngtcp2_addr& a) {
  core::SocketAddress s;
  s.len = std::min<socklen_t>(a.addrlen, sizeof s.storage);
  memcpy(&s.storage, a.addr, s.len);
  return s;
}

bool same_address(const core::SocketAddress& a, const ngtcp2_addr& b) {
  return a.len == b.addrlen && memcmp(&a.storage, b.addr, a.len) == 0;
}

}  // namespace

// ----------------------------------------------------------------------------------------------
// H3Connection

H3Connection::H3Connection(Endpoint& ep, const Datagram& d)
    : ep_(ep),
      local_(d.local),
      remote_(d.remote),
      peer_(http::Peer::from(d.remote)),
      timer_(ep.loop().timers(), [this] { on_timer(); }) {
  ngtcp2_connection_close_error_default(&last_error_);
}

H3Connection::~H3Connection() {
  for (auto& [id, s] : streams_) s->finish();
  streams_.clear();
  for (const auto& k : keys_) ep_.unlink(k, this);
  if (h3_) nghttp3_conn_del(h3_);
  if (conn_) ngtcp2_conn_del(conn_);
  if (session_) gnutls_deinit(session_);
}

std::unique_ptr<H3Connection> H3Connection::accept(Endpoint& ep, const Datagram& d,
                                                   const ngtcp2_pkt_hd& hd, const ngtcp2_cid& odcid,
                                                   bool retried, const ngtcp2_vec& token,
                                                   bool unvalidated) {
  std::unique_ptr<H3Connection> c(new H3Connection(ep, d));
  c->unvalidated_ = unvalidated;
  if (!c->init(hd, odcid, retried, token)) return nullptr;
  return c;
}

bool H3Connection::init(const ngtcp2_pkt_hd& hd, const ngtcp2_cid& odcid, bool retried,
                        const ngtcp2_vec& token) {
  const auto& opt = ep_.options();
  const auto& ctx = ep_.ctx();
  ngtcp2_cid scid;
  scid.datalen = kCidLength;
  do {
    make_cid(scid.data, static_cast<uint32_t>(ctx.slot), ctx.key.tag, ctx.generation_index());
  } while (ep_.cid_taken(scid.data, scid.datalen));

  ngtcp2_callbacks cb{};
  cb.recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = ngtcp2_crypto_decrypt_cb;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.update_key = ngtcp2_crypto_update_key_cb;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb.rand = on_rand;
  cb.get_new_connection_id = on_get_new_connection_id;
  cb.remove_connection_id = on_remove_connection_id;
  cb.recv_stream_data = on_recv_stream_data;
  cb.acked_stream_data_offset = on_acked_stream_data_offset;
  cb.stream_close = on_stream_close;
  cb.stream_reset = on_stream_reset;
  cb.stream_stop_sending = on_stream_stop_sending;
  cb.extend_max_remote_streams_bidi = on_extend_max_remote_streams_bidi;
  cb.extend_max_stream_data = on_extend_max_stream_data;
  cb.recv_tx_key = on_recv_tx_key;
  cb.handshake_completed = on_handshake_completed;

  ngtcp2_settings settings;
  ngtcp2_settings_default(&settings);
  settings.initial_ts = now_ns();
  settings.max_window = opt.max_window;
  settings.max_stream_window = opt.max_stream_window;
  settings.cc_algo = NGTCP2_CC_ALGO_CUBIC;
  if (token.len) settings.token = token;
  // A spoofed Initial's handshake never completes: its state goes after a few seconds, not
  // ngtcp2's default 10 s (a flood holds at most max_unvalidated_handshakes of them anyway).
  if (unvalidated_)
    settings.handshake_timeout =
        static_cast<uint64_t>(opt.unvalidated_handshake_timeout_ms) * NGTCP2_MILLISECONDS;

  ngtcp2_transport_params params;
  ngtcp2_transport_params_default(&params);
  // Initial receive windows; ngtcp2 auto-tunes them up to max_window / max_stream_window as the
  // peer sends (uploads). Downloads depend on the client's windows, not these.
  params.initial_max_stream_data_bidi_local = 256 * 1024;
  params.initial_max_stream_data_bidi_remote = 1024 * 1024;
  params.initial_max_stream_data_uni = 256 * 1024;
  params.initial_max_data = 4 * 1024 * 1024;
  params.initial_max_streams_bidi = opt.max_streams_bidi;
  params.initial_max_streams_uni = 3;
  params.max_idle_timeout = static_cast<uint64_t>(opt.idle_timeout_ms) * NGTCP2_MILLISECONDS;
  params.active_connection_id_limit = 7;
  params.original_dcid = odcid;
  if (retried) {
    params.retry_scid = hd.dcid;
    params.retry_scid_present = 1;
  }
  params.stateless_reset_token_present = 1;
  if (ngtcp2_crypto_generate_stateless_reset_token(params.stateless_reset_token, ep_.secret(),
                                                   Endpoint::kSecretLen, &scid) != 0)
    return false;

  ngtcp2_path path;
  path.local = addr_of(local_);
  path.remote = addr_of(remote_);
  path.user_data = nullptr;
  int rv = ngtcp2_conn_server_new(&conn_, &hd.scid, &scid, &path, hd.version, &cb, &settings,
                                  &params, nullptr, this);
  if (rv != 0) {
    ep_.log().warn("quic_conn_new", "error=\"{}\"", ngtcp2_strerror(rv));
    return false;
  }
  if (!setup_tls()) return false;
  std::string k = Endpoint::server_key(scid.data, scid.datalen);
  if (!ep_.link(k, this)) return false;
  keys_.push_back(std::move(k));
  // The DCID the client keeps using until it learns our SCID: its own choice (keyed with its
  // address: not unique), or after a Retry the SCID of our Retry (ours: unique).
  k = cid_is_ours(hd.dcid.data, hd.dcid.datalen, ctx.key.tag)
          ? Endpoint::server_key(hd.dcid.data, hd.dcid.datalen)
          : Endpoint::client_key(hd.dcid.data, hd.dcid.datalen, remote_);
  if (ep_.link(k, this)) keys_.push_back(std::move(k));
  return true;
}

bool H3Connection::setup_tls() {
  const auto& ctx = ep_.ctx();
  if (gnutls_init(&session_,
                  GNUTLS_SERVER | GNUTLS_NO_AUTO_SEND_TICKET | GNUTLS_NO_END_OF_EARLY_DATA) != 0)
    return false;
  const char* err = nullptr;
  if (gnutls_priority_set_direct(session_, kPriority, &err) != 0) return false;
  if (ctx.ticket_key && gnutls_session_ticket_enable_server(session_, ctx.ticket_key->get()) != 0)
    return false;
  if (ngtcp2_crypto_gnutls_configure_server_session(session_) != 0) return false;
  conn_ref_.get_conn = get_conn;
  conn_ref_.user_data = this;
  gnutls_session_set_ptr(session_, &conn_ref_);
  if (!ctx.credentials ||
      gnutls_credentials_set(session_, GNUTLS_CRD_CERTIFICATE, ctx.credentials->get()) != 0)
    return false;
  gnutls_datum_t alpn{const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>("h3")), 2};
  if (gnutls_alpn_set_protocols(session_, &alpn, 1,
                                GNUTLS_ALPN_MANDATORY | GNUTLS_ALPN_SERVER_PRECEDENCE) != 0)
    return false;
  gnutls_handshake_set_hook_function(session_, GNUTLS_HANDSHAKE_CLIENT_HELLO, GNUTLS_HOOK_POST,
                                     alpn_hook);
  ngtcp2_conn_set_tls_native_handle(conn_, session_);
  return true;
}

ngtcp2_conn* H3Connection::get_conn(ngtcp2_crypto_conn_ref* ref) {
  return static_cast<H3Connection*>(ref->user_data)->conn_;
}

void H3Connection::on_rand(uint8_t* dest, size_t len, const ngtcp2_rand_ctx*) {
  // gnutls_rnd is fork-safe (a PRNG seeded before fork would repeat across processes).
  (void)gnutls_rnd(GNUTLS_RND_RANDOM, dest, len);
}

int H3Connection::on_get_new_connection_id(ngtcp2_conn*, ngtcp2_cid* cid, uint8_t* token,
                                           size_t cidlen, void* ud) {
  auto* c = self(ud);
  if (cidlen != kCidLength) return NGTCP2_ERR_CALLBACK_FAILURE;
  const auto& ctx = c->ep_.ctx();
  do {
    make_cid(cid->data, static_cast<uint32_t>(ctx.slot), ctx.key.tag, ctx.generation_index());
    cid->datalen = cidlen;
  } while (c->ep_.cid_taken(cid->data, cidlen));
  if (ngtcp2_crypto_generate_stateless_reset_token(token, c->ep_.secret(), Endpoint::kSecretLen,
                                                   cid) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  std::string k = Endpoint::server_key(cid->data, cid->datalen);
  if (!c->ep_.link(k, c)) return NGTCP2_ERR_CALLBACK_FAILURE;
  c->keys_.push_back(std::move(k));
  return 0;
}

int H3Connection::on_remove_connection_id(ngtcp2_conn*, const ngtcp2_cid* cid, void* ud) {
  auto* c = self(ud);
  std::string k = Endpoint::server_key(cid->data, cid->datalen);
  c->ep_.unlink(k, c);
  auto it = std::find(c->keys_.begin(), c->keys_.end(), k);
  if (it != c->keys_.end()) c->keys_.erase(it);
  return 0;
}

int H3Connection::on_recv_tx_key(ngtcp2_conn*, ngtcp2_crypto_level level, void* ud) {
  if (level != NGTCP2_CRYPTO_LEVEL_APPLICATION) return 0;
  return self(ud)->setup_h3() == 0 ? 0 : NGTCP2_ERR_CALLBACK_FAILURE;
}

int H3Connection::setup_h3() {
  if (h3_) return 0;
  if (ngtcp2_conn_get_max_local_streams_uni(conn_) < 3) return -1;
  nghttp3_callbacks cb{};
  cb.acked_stream_data = h3_acked_stream_data;
  cb.stream_close = h3_stream_close;
  cb.recv_data = h3_recv_data;
  cb.deferred_consume = h3_deferred_consume;
  cb.begin_headers = h3_begin_headers;
  cb.recv_header = h3_recv_header;
  cb.end_headers = h3_end_headers;
  cb.end_stream = h3_end_stream;
  cb.stop_sending = h3_stop_sending;
  cb.reset_stream = h3_reset_stream;
  nghttp3_settings s;
  nghttp3_settings_default(&s);
  s.qpack_max_dtable_capacity = 4096;
  s.qpack_blocked_streams = 100;
  s.max_field_section_size = ep_.tcp().options().limits.max_head_bytes;
  if (nghttp3_conn_server_new(&h3_, &cb, &s, nghttp3_mem_default(), this) != 0) return -1;
  const auto* params = ngtcp2_conn_get_local_transport_params(conn_);
  nghttp3_conn_set_max_client_streams_bidi(h3_, params->initial_max_streams_bidi);
  int64_t ctrl, enc, dec;
  if (ngtcp2_conn_open_uni_stream(conn_, &ctrl, nullptr) != 0) return -1;
  if (nghttp3_conn_bind_control_stream(h3_, ctrl) != 0) return -1;
  if (ngtcp2_conn_open_uni_stream(conn_, &enc, nullptr) != 0) return -1;
  if (ngtcp2_conn_open_uni_stream(conn_, &dec, nullptr) != 0) return -1;
  if (nghttp3_conn_bind_qpack_streams(h3_, enc, dec) != 0) return -1;
  if (ep_.closing()) {
    nghttp3_conn_submit_shutdown_notice(h3_);
    notice_sent_ = true;
    notice_ms_ = ep_.loop().now();
  }
  return 0;
}

int H3Connection::on_handshake_completed(ngtcp2_conn*, void* ud) {
  auto* c = self(ud);
  c->handshake_done_ = true;
  c->handshake_ms_ = c->ep_.loop().now();
  ++c->ep_.stats().handshakes;
  http::add(http::metrics().proto[http::ProcessMetrics::kHttp3].connections);
  c->ep_.handshake_validated(c);  // the client's Handshake packets came back: a real address
  // A session ticket (resumption; early data stays off) and a NEW_TOKEN token that lets the
  // client skip Retry next time, in any process (wall clock, shared secret).
  (void)gnutls_session_ticket_send(c->session_, 1, 0);
  uint8_t token[NGTCP2_CRYPTO_MAX_REGULAR_TOKENLEN];
  const auto* path = ngtcp2_conn_get_path(c->conn_);
  auto n = ngtcp2_crypto_generate_regular_token(token, c->ep_.secret(), Endpoint::kSecretLen,
                                                path->remote.addr, path->remote.addrlen, wall_ns());
  if (n > 0) (void)ngtcp2_conn_submit_new_token(c->conn_, token, static_cast<size_t>(n));
  return 0;
}

int H3Connection::on_recv_stream_data(ngtcp2_conn* conn, uint32_t flags, int64_t sid, uint64_t,
                                      const uint8_t* data, size_t len, void* ud, void*) {
  auto* c = self(ud);
  if (!c->h3_) return 0;
  const bool fin = flags & NGTCP2_STREAM_DATA_FLAG_FIN;
  // A request stream that ends before any HEADERS: nghttp3 0.8 makes that a connection error
  // (H3_FRAME_UNEXPECTED), RFC 9114 §4.1 a stream error (H3_REQUEST_INCOMPLETE). So the FIN of
  // a request stream without a head yet is held back until nghttp3 has read the bytes before it.
  const bool headless = fin && ngtcp2_is_bidi_stream(sid) && !c->stream(sid);
  auto n = nghttp3_conn_read_stream(c->h3_, sid, data, len, fin && !headless);
  if (n < 0) {
    ngtcp2_connection_close_error_set_application_error(
        &c->last_error_, nghttp3_err_infer_quic_app_error_code(static_cast<int>(n)), nullptr, 0);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  ngtcp2_conn_extend_max_stream_offset(conn, sid, static_cast<uint64_t>(n));
  ngtcp2_conn_extend_max_offset(conn, static_cast<uint64_t>(n));
  if (!headless) return 0;
  if (!c->stream(sid)) {
    ++c->ep_.stats().requests_incomplete;
    c->ep_.log().debug("h3_request_incomplete", "remote={} stream={}", c->peer_.text(), sid);
    (void)nghttp3_conn_shutdown_stream_read(c->h3_, sid);
    (void)ngtcp2_conn_shutdown_stream(conn, sid, NGHTTP3_H3_REQUEST_INCOMPLETE);
    return 0;
  }
  // The head came in these bytes: now the FIN.
  n = nghttp3_conn_read_stream(c->h3_, sid, nullptr, 0, 1);
  if (n < 0) {
    ngtcp2_connection_close_error_set_application_error(
        &c->last_error_, nghttp3_err_infer_quic_app_error_code(static_cast<int>(n)), nullptr, 0);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

int H3Connection::on_acked_stream_data_offset(ngtcp2_conn*, int64_t sid, uint64_t, uint64_t len,
                                              void* ud, void*) {
  auto* c = self(ud);
  if (!c->h3_) return 0;
  if (nghttp3_conn_add_ack_offset(c->h3_, sid, len) != 0) return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

int H3Connection::on_stream_close(ngtcp2_conn* conn, uint32_t flags, int64_t sid, uint64_t code,
                                  void* ud, void*) {
  auto* c = self(ud);
  if (!c->h3_) return 0;
  if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET)) code = NGHTTP3_H3_NO_ERROR;
  int rv = nghttp3_conn_close_stream(c->h3_, sid, code);
  if (rv == NGHTTP3_ERR_STREAM_NOT_FOUND) {
    if (ngtcp2_is_bidi_stream(sid)) ngtcp2_conn_extend_max_streams_bidi(conn, 1);
  } else if (rv != 0) {
    ngtcp2_connection_close_error_set_application_error(
        &c->last_error_, nghttp3_err_infer_quic_app_error_code(rv), nullptr, 0);
    return NGTCP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

int H3Connection::on_stream_reset(ngtcp2_conn*, int64_t sid, uint64_t, uint64_t, void* ud, void*) {
  auto* c = self(ud);
  if (c->h3_ && nghttp3_conn_shutdown_stream_read(c->h3_, sid) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

int H3Connection::on_stream_stop_sending(ngtcp2_conn*, int64_t sid, uint64_t, void* ud, void*) {
  auto* c = self(ud);
  if (c->h3_ && nghttp3_conn_shutdown_stream_read(c->h3_, sid) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

int H3Connection::on_extend_max_remote_streams_bidi(ngtcp2_conn*, uint64_t max, void* ud) {
  auto* c = self(ud);
  if (c->h3_) nghttp3_conn_set_max_client_streams_bidi(c->h3_, max);
  return 0;
}

int H3Connection::on_extend_max_stream_data(ngtcp2_conn*, int64_t sid, uint64_t, void* ud, void*) {
  auto* c = self(ud);
  if (c->h3_ && nghttp3_conn_unblock_stream(c->h3_, sid) != 0) return NGTCP2_ERR_CALLBACK_FAILURE;
  return 0;
}

H3Stream* H3Connection::stream(int64_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

int H3Connection::h3_acked_stream_data(nghttp3_conn*, int64_t, uint64_t len, void*, void* sud) {
  if (sud) static_cast<H3Stream*>(sud)->acked(len);
  return 0;
}

int H3Connection::h3_stream_close(nghttp3_conn*, int64_t sid, uint64_t, void* ud, void*) {
  auto* c = self(ud);
  auto it = c->streams_.find(sid);
  if (it != c->streams_.end()) {
    it->second->finish();
    c->ep_.loop().destroy_later(std::move(it->second));
    c->streams_.erase(it);
  }
  if (ngtcp2_is_bidi_stream(sid)) ngtcp2_conn_extend_max_streams_bidi(c->conn_, 1);
  return 0;
}

int H3Connection::h3_recv_data(nghttp3_conn*, int64_t sid, const uint8_t* data, size_t len,
                               void* ud, void* sud) {
  auto* c = self(ud);
  // Request body bytes: give the flow-control credit back (nghttp3_conn_read_stream's return
  // value excludes DATA payload).
  ngtcp2_conn_extend_max_stream_offset(c->conn_, sid, len);
  ngtcp2_conn_extend_max_offset(c->conn_, len);
  if (sud) static_cast<H3Stream*>(sud)->add_body(data, len);
  return 0;
}

int H3Connection::h3_deferred_consume(nghttp3_conn*, int64_t sid, size_t consumed, void* ud,
                                      void*) {
  auto* c = self(ud);
  ngtcp2_conn_extend_max_stream_offset(c->conn_, sid, consumed);
  ngtcp2_conn_extend_max_offset(c->conn_, consumed);
  return 0;
}

int H3Connection::h3_begin_headers(nghttp3_conn* h3, int64_t sid, void* ud, void*) {
  auto* c = self(ud);
  auto s = std::make_unique<H3Stream>(*c, sid);
  nghttp3_conn_set_stream_user_data(h3, sid, s.get());
  c->streams_[sid] = std::move(s);
  return 0;
}

int H3Connection::h3_recv_header(nghttp3_conn*, int64_t, int32_t token, nghttp3_rcbuf* name,
                                 nghttp3_rcbuf* value, uint8_t, void*, void* sud) {
  if (!sud) return 0;
  auto n = nghttp3_rcbuf_get_buf(name);
  auto v = nghttp3_rcbuf_get_buf(value);
  std::string_view nv(reinterpret_cast<const char*>(n.base), n.len);
  std::string_view vv(reinterpret_cast<const char*>(v.base), v.len);
  static_cast<H3Stream*>(sud)->head().add(pseudo_of(token, nv), nv, vv);
  return 0;
}

int H3Connection::h3_end_headers(nghttp3_conn*, int64_t, int, void*, void* sud) {
  if (sud) static_cast<H3Stream*>(sud)->headers_done();
  return 0;
}

int H3Connection::h3_end_stream(nghttp3_conn*, int64_t, void*, void* sud) {
  if (sud) static_cast<H3Stream*>(sud)->request_done();
  return 0;
}

int H3Connection::h3_stop_sending(nghttp3_conn*, int64_t sid, uint64_t code, void* ud, void*) {
  auto* c = self(ud);
  ngtcp2_conn_shutdown_stream_read(c->conn_, sid, code);
  return 0;
}

int H3Connection::h3_reset_stream(nghttp3_conn*, int64_t sid, uint64_t code, void* ud, void*) {
  auto* c = self(ud);
  ngtcp2_conn_shutdown_stream_write(c->conn_, sid, code);
  return 0;
}

// ----------------------------------------------------------------------------------------------
// Packets

void H3Connection::on_datagram(const Datagram& d) {
  if (state_ == State::kGone || state_ == State::kDraining) return;
  if (state_ == State::kClosing) {
    answer_closing(d);
    return;
  }
  ngtcp2_path path;
  path.local = addr_of(d.local);
  path.remote = addr_of(d.remote);
  path.user_data = nullptr;
  ngtcp2_pkt_info pi;
  pi.ecn = d.ecn;
  int rv = ngtcp2_conn_read_pkt(conn_, &path, &pi, d.data, d.len, now_ns());
  if (rv != 0) {
    handle_error(rv);
    return;
  }
  schedule_write();
}

void H3Connection::answer_closing(const Datagram& d) {
  // Answer with the stored CONNECTION_CLOSE, less and less often (1st, 2nd, 4th, 8th...), and to
  // an unvalidated address never more than 3x what it sent.
  ++close_sends_;
  if (unvalidated_) closing_in_ += d.len;
  if ((close_sends_ & (close_sends_ - 1)) != 0) return;
  if (unvalidated_ && closing_out_ + close_pkt_.size() > 3 * closing_in_) return;
  closing_out_ += close_pkt_.size();
  ++ep_.stats().packets_out;
  (void)ep_.send(d.local, d.remote, 0, reinterpret_cast<const uint8_t*>(close_pkt_.data()),
                 close_pkt_.size(), 0);
}

void H3Connection::handle_error(int rv) {
  switch (rv) {
    case NGTCP2_ERR_DRAINING:
      enter_closed_period(State::kDraining);
      return;
    case NGTCP2_ERR_DROP_CONN:
    case NGTCP2_ERR_RETRY:
      gone();
      return;
    case NGTCP2_ERR_CRYPTO:
      if (last_error_.type != NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION)
        ngtcp2_connection_close_error_set_transport_error_tls_alert(
            &last_error_, ngtcp2_conn_get_tls_alert(conn_), nullptr, 0);
      break;
    default:
      if (last_error_.type != NGTCP2_CONNECTION_CLOSE_ERROR_CODE_TYPE_APPLICATION)
        ngtcp2_connection_close_error_set_transport_error_liberr(&last_error_, rv, nullptr, 0);
      break;
  }
  ep_.log().debug("quic_conn_error", "remote={} error=\"{}\"", peer_.text(), ngtcp2_strerror(rv));
  start_closing(last_error_);
}

void H3Connection::start_closing(const ngtcp2_connection_close_error& err) {
  if (state_ != State::kOpen) return;
  if (!conn_ || ngtcp2_conn_is_in_draining_period(conn_)) {
    enter_closed_period(State::kDraining);
    return;
  }
  if (ngtcp2_conn_is_in_closing_period(conn_)) {
    enter_closed_period(State::kClosing);
    return;
  }
  std::vector<uint8_t> buf(NGTCP2_MAX_UDP_PAYLOAD_SIZE);
  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  ngtcp2_pkt_info pi;
  auto n = ngtcp2_conn_write_connection_close(conn_, &ps.path, &pi, buf.data(), buf.size(), &err,
                                              now_ns());
  if (n <= 0) {
    gone();
    return;
  }
  close_pkt_.assign(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
  ++ep_.stats().packets_out;
  (void)ep_.send(socket_address(ps.path.local), socket_address(ps.path.remote), pi.ecn, buf.data(),
                 static_cast<size_t>(n), 0);
  enter_closed_period(State::kClosing);
}

void H3Connection::enter_closed_period(State s) {
  state_ = s;
  for (auto& [id, st] : streams_) st->finish();
  // RFC 9000 §10.2: three PTOs, then the state is gone.
  uint64_t pto_ms = ngtcp2_conn_get_pto(conn_) / NGTCP2_MILLISECONDS + 1;
  timer_.arm_after(3 * pto_ms);
}

void H3Connection::gone() {
  if (state_ == State::kGone) return;
  state_ = State::kGone;
  timer_.cancel();
  for (auto& [id, st] : streams_) st->finish();
  ep_.remove(this);
}

void H3Connection::close_now() {
  if (state_ != State::kOpen) {
    gone();
    return;
  }
  ngtcp2_connection_close_error err;
  ngtcp2_connection_close_error_default(&err);
  ngtcp2_connection_close_error_set_application_error(&err, NGHTTP3_H3_NO_ERROR, nullptr, 0);
  start_closing(err);
  gone();  // the server is going away: no closing period to wait out
}

void H3Connection::shutdown_notice() {
  if (h3_ && state_ == State::kOpen && !notice_sent_) {
    nghttp3_conn_submit_shutdown_notice(h3_);
    notice_sent_ = true;
    notice_ms_ = ep_.loop().now();
    schedule_write();
  }
}

bool H3Connection::goaway(uint64_t now_ms) {
  if (!h3_ || state_ != State::kOpen || goaway_sent_) return false;
  // The round trip is counted from the later of the notice and the handshake's end (the H3 layer
  // and its notice come with the 0.5-RTT keys, before the client has even seen our flight), and
  // is at least two smoothed RTTs: the client's first requests are on their way by then.
  if (!notice_sent_ || !handshake_done_) return false;
  ngtcp2_conn_stat cstat;
  ngtcp2_conn_get_conn_stat(conn_, &cstat);
  uint64_t wait_ms =
      std::max<uint64_t>(kGoawayAfterMs, 2 * cstat.smoothed_rtt / NGTCP2_MILLISECONDS);
  if (now_ms - std::max(notice_ms_, handshake_ms_) < wait_ms) return false;
  goaway_sent_ = true;
  goaway_ms_ = now_ms;
  if (nghttp3_conn_shutdown(h3_) != 0) return false;
  schedule_write();
  return true;
}

bool H3Connection::parked_any() const {
  for (const auto& [id, s] : streams_)
    if (s->parked()) return true;
  return false;
}

void H3Connection::tick_parked(uint64_t) {
  for (auto& [id, s] : streams_)
    if (s->parked()) s->retry_parked();
}

void H3Connection::arm_timer() {
  if (state_ != State::kOpen) return;
  ngtcp2_tstamp expiry = ngtcp2_conn_get_expiry(conn_);
  if (expiry == UINT64_MAX) {
    timer_.cancel();
    return;
  }
  // Millisecond timer wheel: round up, so the expiry has passed when the timer fires.
  timer_.arm_at((expiry + NGTCP2_MILLISECONDS - 1) / NGTCP2_MILLISECONDS);
}

void H3Connection::on_timer() {
  if (state_ == State::kClosing || state_ == State::kDraining) {
    gone();
    return;
  }
  if (state_ != State::kOpen) return;
  int rv = ngtcp2_conn_handle_expiry(conn_, now_ns());
  if (rv == NGTCP2_ERR_IDLE_CLOSE) {
    gone();  // no CONNECTION_CLOSE after an idle timeout (RFC 9000 §10.1)
    return;
  }
  if (rv == NGTCP2_ERR_HANDSHAKE_TIMEOUT) {
    // Nobody answered (a spoofed Initial, most likely): no CONNECTION_CLOSE and no closing
    // period, the state goes now.
    ++ep_.stats().handshake_timeouts;
    gone();
    return;
  }
  if (rv != 0) {
    handle_error(rv);
    return;
  }
  write();
}

void H3Connection::on_writable() {
  if (state_ != State::kOpen) return;
  if (flush_pending()) write();
}

bool H3Connection::flush_pending() {
  if (pending_.empty()) return true;
  auto r =
      ep_.send(pending_local_, pending_remote_, pending_ecn_,
               reinterpret_cast<const uint8_t*>(pending_.data()), pending_.size(), pending_gso_);
  if (r == Endpoint::SendResult::kBlocked) {
    ep_.wait_writable(this);
    return false;
  }
  pending_.clear();
  return true;
}

void H3Connection::write() {
  if (state_ != State::kOpen || !conn_) return;
  if (!flush_pending()) return;
  ngtcp2_tstamp ts = now_ns();
  const size_t max = ngtcp2_conn_get_path_max_tx_udp_payload_size(conn_);
  size_t max_pkts = ngtcp2_conn_get_send_quantum(conn_) / max;
  max_pkts = std::clamp<size_t>(max_pkts, 1, 64);
  auto& txbuf = ep_.tx_buffer();
  if (txbuf.size() < max * max_pkts) txbuf.resize(max * max_pkts);

  ngtcp2_path_storage ps;
  ngtcp2_path_storage_zero(&ps);
  core::SocketAddress batch_local, batch_remote;
  uint8_t batch_ecn = 0;
  size_t off = 0, npkts = 0, gso = 0;

  auto send_batch = [&](size_t len) {
    if (len == 0) return true;
    auto r = ep_.send(batch_local, batch_remote, batch_ecn, txbuf.data(), len, npkts > 1 ? gso : 0);
    if (r == Endpoint::SendResult::kBlocked) {
      pending_.assign(reinterpret_cast<const char*>(txbuf.data()), len);
      pending_gso_ = npkts > 1 ? gso : 0;
      pending_ecn_ = batch_ecn;
      pending_local_ = batch_local;
      pending_remote_ = batch_remote;
      ep_.wait_writable(this);
      return false;
    }
    return true;
  };

  for (;;) {
    int64_t sid = -1;
    int fin = 0;
    nghttp3_vec vec[16];
    nghttp3_ssize nvec = 0;
    if (h3_ && ngtcp2_conn_get_max_data_left(conn_)) {
      nvec = nghttp3_conn_writev_stream(h3_, &sid, &fin, vec, 16);
      if (nvec < 0) {
        ngtcp2_connection_close_error_set_application_error(
            &last_error_, nghttp3_err_infer_quic_app_error_code(static_cast<int>(nvec)), nullptr,
            0);
        start_closing(last_error_);
        return;
      }
    }
    ngtcp2_ssize ndatalen = -1;
    ngtcp2_pkt_info pi;
    uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE;
    if (fin) flags |= NGTCP2_WRITE_STREAM_FLAG_FIN;
    auto nwrite = ngtcp2_conn_writev_stream(
        conn_, &ps.path, &pi, txbuf.data() + off, max, &ndatalen, flags, sid,
        reinterpret_cast<const ngtcp2_vec*>(vec), static_cast<size_t>(nvec), ts);
    if (nwrite < 0) {
      switch (nwrite) {
        case NGTCP2_ERR_STREAM_DATA_BLOCKED:
          nghttp3_conn_block_stream(h3_, sid);
          continue;
        case NGTCP2_ERR_STREAM_SHUT_WR:
          nghttp3_conn_shutdown_stream_write(h3_, sid);
          continue;
        case NGTCP2_ERR_WRITE_MORE:
          if (nghttp3_conn_add_write_offset(h3_, sid, static_cast<size_t>(ndatalen)) != 0) {
            ngtcp2_connection_close_error_set_application_error(
                &last_error_, NGHTTP3_H3_INTERNAL_ERROR, nullptr, 0);
            start_closing(last_error_);
            return;
          }
          continue;
        default:
          ngtcp2_connection_close_error_set_transport_error_liberr(
              &last_error_, static_cast<int>(nwrite), nullptr, 0);
          start_closing(last_error_);
          return;
      }
    }
    if (ndatalen >= 0 && sid >= 0 &&
        nghttp3_conn_add_write_offset(h3_, sid, static_cast<size_t>(ndatalen)) != 0) {
      ngtcp2_connection_close_error_set_application_error(&last_error_, NGHTTP3_H3_INTERNAL_ERROR,
                                                          nullptr, 0);
      start_closing(last_error_);
      return;
    }
    if (nwrite == 0) {
      send_batch(off);
      break;
    }
    ++ep_.stats().packets_out;
    size_t sz = static_cast<size_t>(nwrite);
    // A packet joins the GSO batch when it goes the same way with the same ECN and is not
    // larger than the batch's segment size.
    if (npkts > 0 &&
        (!same_address(batch_local, ps.path.local) || !same_address(batch_remote, ps.path.remote) ||
         pi.ecn != batch_ecn || sz > gso)) {
      if (!send_batch(off)) break;
      memmove(txbuf.data(), txbuf.data() + off, sz);
      off = 0;
      npkts = 0;
    }
    if (npkts == 0) {
      batch_local = socket_address(ps.path.local);
      batch_remote = socket_address(ps.path.remote);
      batch_ecn = pi.ecn;
      gso = sz;
    }
    off += sz;
    ++npkts;
    if (sz < gso || npkts >= max_pkts) {
      bool full = npkts >= max_pkts;
      if (!send_batch(off)) break;
      off = 0;
      npkts = 0;
      if (full) {
        // The send quantum is out. Come back on the next loop round (after the ACKs that
        // arrived meanwhile) rather than on the millisecond timer: ngtcp2's pacing decides then
        // whether more may go (nothing is written if not, and the timer takes over).
        ep_.schedule_write(this);
        break;
      }
    }
  }
  ngtcp2_conn_update_pkt_tx_time(conn_, ts);
  arm_timer();
}

}  // namespace corral::quic
