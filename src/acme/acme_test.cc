#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/x509.h>
#include <gtest/gtest.h>

#include "acme/http_client.h"
#include "acme/jws.h"
#include "acme/order.h"
#include "tls/acme_board.h"
#include "tls/alpn_challenge.h"

namespace corral::acme {
namespace {

using nlohmann::json;

TEST(Base64Url, RoundTripsWithoutPadding) {
  EXPECT_EQ(base64url(""), "");
  EXPECT_EQ(base64url("f"), "Zg");
  EXPECT_EQ(base64url("fo"), "Zm8");
  EXPECT_EQ(base64url("foo"), "Zm9v");
  EXPECT_EQ(base64url("\xfb\xff"), "-_8");
  for (std::string s : {"", "a", "ab", "abc", "abcd", "\x00\xff\xfe"}) {
    auto d = base64url_decode(base64url(s));
    ASSERT_TRUE(d);
    EXPECT_EQ(d.value(), s);
  }
  EXPECT_FALSE(base64url_decode("a+b"));
  EXPECT_FALSE(base64url_decode("a"));
}

TEST(Jws, DerSignatureBecomesFixedWidthRs) {
  // SEQUENCE { INTEGER 0x00ff (leading zero), INTEGER 0x01 }
  std::string der("\x30\x07\x02\x02\x00\xff\x02\x01\x01", 9);
  auto raw = der_signature_to_raw(der, 4);
  ASSERT_TRUE(raw) << raw.error().reason;
  EXPECT_EQ(raw.value(), std::string("\x00\x00\x00\xff\x00\x00\x00\x01", 8));
  EXPECT_FALSE(der_signature_to_raw("garbage"));
}

// Verifies an ES256 JWS with the public key its JWK names (as a CA does).
bool verify(const json& jwk, const std::string& input, const std::string& raw_sig) {
  auto x = base64url_decode(jwk["x"].get<std::string>());
  auto y = base64url_decode(jwk["y"].get<std::string>());
  if (!x || !y || raw_sig.size() != 64) return false;
  gnutls_pubkey_t pub;
  gnutls_pubkey_init(&pub);
  gnutls_datum_t dx{reinterpret_cast<unsigned char*>(x->data()), 32};
  gnutls_datum_t dy{reinterpret_cast<unsigned char*>(y->data()), 32};
  int rc = gnutls_pubkey_import_ecc_raw(pub, GNUTLS_ECC_CURVE_SECP256R1, &dx, &dy);
  gnutls_datum_t r{reinterpret_cast<unsigned char*>(const_cast<char*>(raw_sig.data())), 32};
  gnutls_datum_t s{reinterpret_cast<unsigned char*>(const_cast<char*>(raw_sig.data())) + 32, 32};
  gnutls_datum_t der{};
  if (rc == 0) rc = gnutls_encode_rs_value(&der, &r, &s);
  gnutls_datum_t data{reinterpret_cast<unsigned char*>(const_cast<char*>(input.data())),
                      static_cast<unsigned>(input.size())};
  if (rc == 0) rc = gnutls_pubkey_verify_data2(pub, GNUTLS_SIGN_ECDSA_SHA256, 0, &data, &der);
  gnutls_free(der.data);
  gnutls_pubkey_deinit(pub);
  return rc >= 0;
}

TEST(Jws, SignsWithJwkThenKidAndVerifies) {
  auto key = AccountKey::generate();
  ASSERT_TRUE(key) << key.error().reason;
  EXPECT_EQ(key->jwk()["kty"], "EC");
  EXPECT_EQ(key->jwk()["crv"], "P-256");
  // RFC 7638: members in lexicographic order, no whitespace.
  EXPECT_EQ(key->thumbprint(), base64url(sha256(key->jwk().dump())));
  EXPECT_EQ(key->jwk().dump().find("{\"crv\":\"P-256\",\"kty\":\"EC\",\"x\":\""), 0u);
  auto body = sign_request(key.value(), "", "n1", "https://ca/new-acct", R"({"a":1})");
  ASSERT_TRUE(body);
  auto j = json::parse(body.value());
  auto prot = json::parse(base64url_decode(j["protected"].get<std::string>()).value());
  EXPECT_EQ(prot["alg"], "ES256");
  EXPECT_EQ(prot["nonce"], "n1");
  EXPECT_EQ(prot["url"], "https://ca/new-acct");
  EXPECT_EQ(prot["jwk"], key->jwk());
  EXPECT_FALSE(prot.contains("kid"));
  auto sig = base64url_decode(j["signature"].get<std::string>());
  ASSERT_TRUE(sig);
  EXPECT_TRUE(verify(key->jwk(),
                     j["protected"].get<std::string>() + "." + j["payload"].get<std::string>(),
                     sig.value()));
  auto get = sign_request(key.value(), "https://ca/acct/1", "n2", "https://ca/o/1", "");
  auto g = json::parse(get.value());
  EXPECT_EQ(g["payload"], "");  // POST-as-GET
  auto gp = json::parse(base64url_decode(g["protected"].get<std::string>()).value());
  EXPECT_EQ(gp["kid"], "https://ca/acct/1");
  EXPECT_FALSE(gp.contains("jwk"));
  // The key survives a PEM round trip with the same thumbprint.
  auto again = AccountKey::from_pem(key->pem().value());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->thumbprint(), key->thumbprint());
  EXPECT_EQ(key_authorization("tok", key.value()), "tok." + key->thumbprint());
}

TEST(Jws, CertificateRequestNamesEveryDomain) {
  auto req = make_certificate_request({"a.example", "b.example"});
  ASSERT_TRUE(req) << req.error().reason;
  gnutls_x509_crq_t crq;
  gnutls_x509_crq_init(&crq);
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(req->csr_der.data()),
                   static_cast<unsigned>(req->csr_der.size())};
  ASSERT_EQ(gnutls_x509_crq_import(crq, &d, GNUTLS_X509_FMT_DER), 0);
  EXPECT_EQ(gnutls_x509_crq_verify(crq, 0), 0);
  char name[64];
  size_t size = sizeof name;
  unsigned critical = 0;
  ASSERT_EQ(gnutls_x509_crq_get_subject_alt_name(crq, 1, name, &size, nullptr, &critical),
            GNUTLS_SAN_DNSNAME);
  EXPECT_EQ(std::string(name, size), "b.example");
  gnutls_x509_crq_deinit(crq);
  EXPECT_FALSE(make_certificate_request({}));
}

TEST(HttpClient, ParsesLengthChunkedAndHead) {
  auto r = parse_response(
      "HTTP/1.1 201 Created\r\nLocation: https://ca/o/1\r\nreplay-nonce:  abc \r\n"
      "Content-Length: 2\r\n\r\n{}extra");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->location, "https://ca/o/1");
  EXPECT_EQ(r->replay_nonce, "abc");
  EXPECT_EQ(r->body, "{}");
  auto c = parse_response(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n1;x=y\r\nd\r\n0\r\n\r\n");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->body, "abcd");
  auto h = parse_response("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", true);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->body, "");
  EXPECT_FALSE(parse_response("HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nshort"));
  EXPECT_FALSE(parse_response("SMTP 200\r\n\r\n"));
  EXPECT_FALSE(parse_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"));
}

// A scripted CA: answers by the request's URL.
class OrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto k = AccountKey::generate();
    ASSERT_TRUE(k);
    key_ = std::make_unique<AccountKey>(std::move(k.value()));
  }
  static Response ok(int status, json body, std::string location = {}) {
    Response r;
    r.status = status;
    r.body = body.dump();
    r.location = std::move(location);
    r.replay_nonce = "nonce" + std::to_string(++counter_);
    return r;
  }
  static json payload(const Request& req) {
    auto j = json::parse(req.body);
    auto p = base64url_decode(j["payload"].get<std::string>()).value();
    return p.empty() ? json() : json::parse(p);
  }
  static json protected_header(const Request& req) {
    auto j = json::parse(req.body);
    return json::parse(base64url_decode(j["protected"].get<std::string>()).value());
  }
  std::unique_ptr<AccountKey> key_;
  static inline int counter_ = 0;
};

TEST_F(OrderTest, RunsTheWholeFlowWithBadNonceAndRetryAfter) {
  OrderOptions o;
  o.directory_url = "https://ca/dir";
  o.email = "ops@example.org";
  o.domains = {"example.org"};
  Order order(o, *key_, "CSR");
  json dir = {{"newNonce", "https://ca/nonce"},
              {"newAccount", "https://ca/acct"},
              {"newOrder", "https://ca/order"}};
  json authz_pending = {
      {"status", "pending"},
      {"identifier", {{"type", "dns"}, {"value", "example.org"}}},
      {"challenges",
       {{{"type", "dns-01"}, {"url", "https://ca/c/dns"}, {"token", "dnstok"}},
        {{"type", "tls-alpn-01"}, {"url", "https://ca/c/alpn"}, {"token", "alpntok"}},
        {{"type", "http-01"}, {"url", "https://ca/c/http"}, {"token", "httptok"}}}}};
  json authz_valid = authz_pending;
  authz_valid["status"] = "valid";

  Step s = order.next();
  ASSERT_EQ(s.kind, Step::kSend);
  EXPECT_EQ(s.request.method, "GET");
  order.on_response(ok(200, dir));
  s = order.next();
  EXPECT_EQ(s.request.method, "HEAD");
  EXPECT_EQ(s.request.url, "https://ca/nonce");
  order.on_response(ok(200, json()));
  s = order.next();
  EXPECT_EQ(s.what, "newAccount");
  EXPECT_EQ(payload(s.request)["contact"][0], "mailto:ops@example.org");
  EXPECT_TRUE(protected_header(s.request).contains("jwk"));
  // badNonce: the same request again, signed with the fresh nonce.
  Response bad = ok(400, {{"type", "urn:ietf:params:acme:error:badNonce"}});
  bad.replay_nonce = "fresh";
  order.on_response(bad);
  s = order.next();
  EXPECT_EQ(s.what, "newAccount");
  EXPECT_EQ(protected_header(s.request)["nonce"], "fresh");
  order.on_response(ok(201, json::object(), "https://ca/acct/7"));
  s = order.next();
  EXPECT_EQ(s.what, "newOrder");
  EXPECT_EQ(protected_header(s.request)["kid"], "https://ca/acct/7");
  EXPECT_EQ(payload(s.request)["identifiers"][0]["value"], "example.org");
  order.on_response(ok(201,
                       {{"status", "pending"},
                        {"authorizations", {"https://ca/authz/1"}},
                        {"finalize", "https://ca/fin"}},
                       "https://ca/o/1"));
  s = order.next();
  EXPECT_EQ(s.request.url, "https://ca/authz/1");
  EXPECT_EQ(payload(s.request), json());  // POST-as-GET
  order.on_response(ok(200, authz_pending));
  s = order.next();
  ASSERT_EQ(s.kind, Step::kPublish);
  ASSERT_EQ(s.answers.size(), 1u);
  EXPECT_EQ(s.answers[0].type, "http-01");  // the first accepted type, not the CA's order
  EXPECT_EQ(s.answers[0].token, "httptok");
  EXPECT_EQ(s.answers[0].key_authorization, "httptok." + key_->thumbprint());
  s = order.next();
  EXPECT_EQ(s.request.url, "https://ca/c/http");
  EXPECT_EQ(payload(s.request), json::object());
  Response processing = ok(200, {{"status", "processing"}});
  processing.retry_after = "3";
  order.on_response(processing);
  s = order.next();
  ASSERT_EQ(s.kind, Step::kWait);
  EXPECT_EQ(s.wait_seconds, 3);
  s = order.next();
  EXPECT_EQ(s.request.url, "https://ca/authz/1");
  order.on_response(ok(200, authz_pending));  // still pending: wait again
  EXPECT_EQ(order.next().kind, Step::kWait);
  s = order.next();
  order.on_response(ok(200, authz_valid));
  s = order.next();
  EXPECT_EQ(s.what, "finalize");
  EXPECT_EQ(payload(s.request)["csr"], base64url("CSR"));
  order.on_response(ok(200, {{"status", "processing"}}));
  EXPECT_EQ(order.next().kind, Step::kWait);
  s = order.next();
  EXPECT_EQ(s.request.url, "https://ca/o/1");
  order.on_response(ok(200, {{"status", "valid"}, {"certificate", "https://ca/cert/1"}}));
  s = order.next();
  EXPECT_EQ(s.request.url, "https://ca/cert/1");
  Response cert = ok(200, json());
  cert.body = "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n";
  order.on_response(cert);
  s = order.next();
  ASSERT_EQ(s.kind, Step::kDone);
  EXPECT_EQ(s.certificate_pem, cert.body);
  EXPECT_EQ(order.account_url(), "https://ca/acct/7");
}

TEST_F(OrderTest, ProblemDocumentsEndTheOrderInOneLine) {
  OrderOptions o;
  o.directory_url = "https://ca/dir";
  o.domains = {"example.org"};
  Order order(o, *key_, "CSR");
  order.next();
  order.on_response(ok(200, {{"newNonce", "n"}, {"newAccount", "a"}, {"newOrder", "o"}}));
  order.next();
  order.on_response(ok(200, json()));
  order.next();
  order.on_response(
      ok(403,
         {{"type", "urn:ietf:params:acme:error:rejectedIdentifier"},
          {"detail", "no"},
          {"subproblems", {{{"identifier", {{"value", "example.org"}}}, {"detail", "policy"}}}}}));
  Step s = order.next();
  ASSERT_EQ(s.kind, Step::kFailed);
  EXPECT_EQ(s.error,
            "HTTP 403 urn:ietf:params:acme:error:rejectedIdentifier: no [example.org: policy]");
}

TEST_F(OrderTest, TooManyBadNoncesFail) {
  OrderOptions o;
  o.directory_url = "https://ca/dir";
  o.domains = {"example.org"};
  Order order(o, *key_, "CSR");
  order.next();
  order.on_response(ok(200, {{"newNonce", "n"}, {"newAccount", "a"}, {"newOrder", "o"}}));
  order.next();
  order.on_response(ok(200, json()));
  for (int i = 0; i <= Order::kMaxBadNonce; ++i) {
    ASSERT_EQ(order.next().kind, Step::kSend);
    order.on_response(ok(400, {{"type", "urn:ietf:params:acme:error:badNonce"}}));
  }
  EXPECT_EQ(order.next().kind, Step::kFailed);
}

TEST(AcmeBoard, PublishesAnswersAndVersions) {
  auto board = tls::AcmeBoard::create("/tmp/x", false);
  ASSERT_TRUE(board);
  auto& b = *board.value();
  EXPECT_EQ(b.certificate_version(), 0u);
  EXPECT_FALSE(b.http01("t"));
  b.publish_answers(
      {{"http-01", "a.example", "t1", "t1.k"}, {"tls-alpn-01", "b.example", "t2", "t2.k"}});
  EXPECT_EQ(b.http01("t1").value_or(""), "t1.k");
  EXPECT_FALSE(b.http01("t2"));
  EXPECT_EQ(b.tls_alpn01("b.example").value_or(""), "t2.k");
  EXPECT_FALSE(b.tls_alpn01("a.example"));
  b.publish_answers({});
  EXPECT_FALSE(b.http01("t1"));
  b.publish_certificate();
  EXPECT_EQ(b.certificate_version(), 1u);
}

TEST(AlpnChallenge, CertificateCarriesCriticalAcmeIdentifier) {
  auto made = tls::make_alpn_challenge_certificate("a.example", "tok.thumb");
  ASSERT_TRUE(made) << made.error().reason;
  gnutls_x509_crt_t crt;
  gnutls_x509_crt_init(&crt);
  gnutls_datum_t d{reinterpret_cast<unsigned char*>(made->cert_pem.data()),
                   static_cast<unsigned>(made->cert_pem.size())};
  ASSERT_EQ(gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM), 0);
  unsigned char buf[64];
  size_t size = sizeof buf;
  unsigned critical = 0;
  ASSERT_EQ(
      gnutls_x509_crt_get_extension_by_oid(crt, tls::kAcmeIdentifierOid, 0, buf, &size, &critical),
      0);
  EXPECT_EQ(critical, 1u);
  ASSERT_EQ(size, 34u);
  EXPECT_EQ(buf[0], 0x04);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf) + 2, 32), sha256("tok.thumb"));
  EXPECT_NE(gnutls_x509_crt_check_hostname(crt, "a.example"), 0u);
  gnutls_x509_crt_deinit(crt);
  EXPECT_TRUE(tls::make_alpn_challenge_credentials("a.example", "tok.thumb"));
}

}  // namespace
}  // namespace corral::acme
