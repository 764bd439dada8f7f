#include "http/admission.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

namespace corral::http {
namespace {

core::SocketAddress address(std::string_view text) {
  return core::parse_address(text).value();
}

Relay relay(std::string_view text) {
  return parse_relay(text).value();
}

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest() { policy_.allowed_hosts = {"example.com", "2001:db8::1"}; }

  // A request built by hand; every view points at a string literal.
  Request request(std::string_view target, std::initializer_list<Header> headers,
                  Method method = Method::kGet, uint8_t minor = 1) {
    Request req;
    req.method = method;
    req.method_name = method_name(method);
    req.target = target;
    req.version_minor = minor;
    for (const auto& h : headers) req.headers.add(h.name, h.value);
    return req;
  }

  Admission admit_from(Request& req, std::string_view peer = "127.0.0.1:40000") {
    return admit(req, address(peer), policy_);
  }

  // The status for a GET of `target` with Host: localhost.
  int target_status(std::string_view target, Method method = Method::kGet) {
    Request req = request(target, {{"Host", "localhost"}}, method);
    return admit_from(req).status;
  }

  int host_status(std::string_view host) {
    Request req = request("/", {{"Host", host}});
    return admit_from(req).status;
  }

  AdmissionPolicy policy_;
};

TEST_F(AdmissionTest, PlainLoopbackGetIsAdmittedAndFilled) {
  Request req = request("/a/b?x=1&y=%20", {{"Host", "localhost:8080"}});
  Admission a = admit_from(req);
  EXPECT_TRUE(a.admitted());
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(req.host, "localhost:8080");
  EXPECT_EQ(req.path, "/a/b");
  EXPECT_EQ(req.query, "x=1&y=%20");
  EXPECT_EQ(req.remote_address, "127.0.0.1");
  EXPECT_EQ(req.scheme, "http");
}

TEST_F(AdmissionTest, CallerSetPathIsKept) {
  Request req = request("/a?b", {{"Host", "localhost"}});
  req.path = "/a";
  req.query = "b";
  ASSERT_TRUE(admit_from(req).admitted());
  EXPECT_EQ(req.path, "/a");
  EXPECT_EQ(req.query, "b");
}

TEST_F(AdmissionTest, RefusedMethods) {
  for (Method m : {Method::kTrace, Method::kTrack, Method::kConnect}) {
    Request req = request("/", {{"Host", "localhost"}}, m);
    EXPECT_EQ(admit_from(req).status, 501) << method_name(m);
  }
  // The method is checked first: even a bad target and host answer 501.
  Request req = request("http://x/", {}, Method::kConnect);
  EXPECT_EQ(admit_from(req).status, 501);
}

TEST_F(AdmissionTest, AbsoluteAndOtherTargetForms) {
  EXPECT_EQ(target_status("http://x/"), 403);
  EXPECT_EQ(target_status("https://example.com/a"), 403);
  EXPECT_EQ(target_status("a+b-c.d:xyz"), 403);
  EXPECT_EQ(target_status("*"), 400);
  EXPECT_EQ(target_status("*", Method::kOptions), 0);
  EXPECT_EQ(target_status("**", Method::kOptions), 400);
  EXPECT_EQ(target_status(""), 400);
  EXPECT_EQ(target_status("example.com:80"), 403);  // looks like scheme ":"
  EXPECT_EQ(target_status("1http://x/"), 400);      // a scheme starts with a letter
  EXPECT_EQ(target_status("a"), 400);
  EXPECT_EQ(target_status("%2F"), 400);
}

TEST_F(AdmissionTest, DotSegments) {
  for (std::string_view t : {"/a/../b", "/a/./b", "/..", "/.", "/a/..", "/a/.", "/a/%2e%2E/b",
                             "/a/%2e/b", "/a/.%2e/b", "/a/%2E./b", "/../a", "/a/..?x"}) {
    EXPECT_EQ(target_status(t), 400) << t;
  }
  // Three dots, dots inside a name, empty segments and dots in the query are fine.
  for (std::string_view t :
       {"/...", "/a.b/c..d", "/.well-known/x", "//a//b/", "/a?x=/../..", "/%2e%2e%2e", "/a/b."}) {
    EXPECT_EQ(target_status(t), 0) << t;
  }
}

TEST_F(AdmissionTest, PercentEscapes) {
  EXPECT_EQ(target_status("/a%zz"), 400);
  EXPECT_EQ(target_status("/a%G0"), 400);
  EXPECT_EQ(target_status("/a%2"), 400);
  EXPECT_EQ(target_status("/a%"), 400);
  EXPECT_EQ(target_status("/a%00b"), 400);
  EXPECT_EQ(target_status("/a?b=%00"), 400);
  EXPECT_EQ(target_status("/a?b=%2"), 400);
  EXPECT_EQ(target_status("/a%20b%C3%A9"), 0);
  EXPECT_EQ(target_status("/a?b=%ff"), 0);
}

TEST_F(AdmissionTest, Characters) {
  EXPECT_EQ(target_status("/a#f"), 400);
  EXPECT_EQ(target_status("/a?b#f"), 400);
  EXPECT_EQ(target_status("/a b"), 400);
  EXPECT_EQ(target_status("/a\tb"), 400);
  EXPECT_EQ(target_status("/a\\b"), 400);
  EXPECT_EQ(target_status("/a\"b"), 400);
  EXPECT_EQ(target_status("/a<b"), 400);
  EXPECT_EQ(target_status("/\xc3\xa9"), 400);  // raw UTF-8 must be escaped
  EXPECT_EQ(std::string_view("/a\0b", 4).size(), 4u);
  EXPECT_EQ(target_status(std::string_view("/a\0b", 4)), 400);
  EXPECT_EQ(target_status("/a-._~!$&'()*+,;=:@/b"), 0);
  EXPECT_EQ(target_status("/a?b=c/d?e:f@g"), 0);
  // Left raw by browsers in a query (WHATWG URL), so accepted there but not in the path.
  EXPECT_EQ(target_status("/a?x=[1]{2}|^`\\"), 0);
  EXPECT_EQ(target_status("/a[1]"), 400);
  EXPECT_EQ(target_status("/a?x y"), 400);
  EXPECT_EQ(target_status("/a?x\"y"), 400);
}

TEST_F(AdmissionTest, LoopbackHostsAlwaysAllowed) {
  policy_.allowed_hosts.clear();
  for (std::string_view h :
       {"localhost", "localhost:8080", "LOCALHOST", "LocalHost:1", "127.0.0.1", "127.0.0.1:1",
        "127.1.2.3:80", "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:80"}) {
    EXPECT_EQ(host_status(h), 0) << h;
  }
}

TEST_F(AdmissionTest, OtherHostsMustBeListed) {
  EXPECT_EQ(host_status("evil.com"), 403);
  EXPECT_EQ(host_status("evil.com:8080"), 403);
  EXPECT_EQ(host_status("example.com"), 0);
  EXPECT_EQ(host_status("example.com:8443"), 0);
  EXPECT_EQ(host_status("EXAMPLE.com"), 0);
  EXPECT_EQ(host_status("sub.example.com"), 403);
  EXPECT_EQ(host_status("example.com.evil.com"), 403);
  EXPECT_EQ(host_status("localhost.evil.com"), 403);
  EXPECT_EQ(host_status("127.0.0.1.evil.com"), 403);
  EXPECT_EQ(host_status("127.0.0.01"), 403);  // not a strict dotted quad: not loopback
  EXPECT_EQ(host_status("128.0.0.1"), 403);
  EXPECT_EQ(host_status("[::2]"), 403);
  // IPv6 allowed as "2001:db8::1": matches every spelling of the address, bracketed.
  EXPECT_EQ(host_status("[2001:db8::1]"), 0);
  EXPECT_EQ(host_status("[2001:DB8:0::1]:443"), 0);
  EXPECT_EQ(host_status("[2001:db8::2]"), 403);
  policy_.allowed_hosts = {"[2001:db8::1]"};
  EXPECT_EQ(host_status("[2001:db8::1]:80"), 0);
}

TEST_F(AdmissionTest, HostSyntax) {
  for (std::string_view h : {"",
                             "exa mple.com",
                             "[::1",
                             "[::1]x",
                             "::1",
                             "a@b",
                             "user@localhost",
                             "localhost:99999",
                             "localhost:123456",
                             "localhost:",
                             "localhost:8o",
                             ":80",
                             "localhost:80:80",
                             "[v1.x]",
                             "[fe80::1%25eth0]",
                             " localhost",
                             "localhost ",
                             "a/b",
                             "a%zz",
                             "a%00"}) {
    EXPECT_EQ(host_status(h), 400) << h;
  }
  EXPECT_EQ(host_status("localhost:65535"), 0);
  EXPECT_EQ(host_status("localhost:0"), 0);
  EXPECT_EQ(host_status("localhost:65536"), 400);
}

TEST_F(AdmissionTest, HostCountAndVersion) {
  Request dup = request("/", {{"Host", "localhost"}, {"host", "localhost"}});
  EXPECT_EQ(admit_from(dup).status, 400);
  Request missing = request("/", {});
  EXPECT_EQ(admit_from(missing).status, 400);
  Request http10 = request("/", {}, Method::kGet, 0);
  EXPECT_EQ(admit_from(http10).status, 0);
  EXPECT_EQ(http10.host, "");
  Request http10_evil = request("/", {{"Host", "evil.com"}}, Method::kGet, 0);
  EXPECT_EQ(admit_from(http10_evil).status, 403);
  Request lower = request("/", {{"host", "localhost"}});
  EXPECT_EQ(admit_from(lower).status, 0);
  EXPECT_EQ(lower.host, "localhost");
}

TEST_F(AdmissionTest, ForwardedHeadersFromNonRelay) {
  for (std::string_view name : {"X-Forwarded-For", "x-forwarded-for", "Forwarded",
                                "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP"}) {
    Request req = request("/", {{"Host", "localhost"}, {name, "1.2.3.4"}});
    Admission a = admit_from(req);
    EXPECT_EQ(a.status, 403) << name;
    EXPECT_EQ(a.reason.rfind("forwarded header from a non-relay: ", 0), 0u);
    EXPECT_NE(a.reason.find("relays (or --relay"), std::string_view::npos);
  }
  policy_.relays = {relay("10.0.0.0/8")};
  Request req = request("/", {{"Host", "localhost"}, {"X-Forwarded-For", "1.2.3.4"}});
  EXPECT_EQ(admit_from(req).status, 403);
}

TEST_F(AdmissionTest, TrustedHeadersSpeltWithUnderscoresAreDropped) {
  Request req = request("/", {{"Host", "localhost"},
                              {"Corral_Principal", "admin"},
                              {"corral_principal", "admin"},
                              {"CORRAL_Remote_Address", "10.0.0.1"},
                              {"Corral-Principal", "kept: the proxy strips its own spelling"},
                              {"X_Forwarded_For", "1.2.3.4"},
                              {"x_forwarded_host", "evil"},
                              {"X_Real_IP", "1.2.3.4"},
                              {"My_Header", "ok"},
                              {"Forwarded_X", "ok"},
                              {"X_Forwarded", "ok"},
                              {"X-Ordinary", "ok"}});
  Admission a = admit_from(req);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.dropped_headers, 6);
  std::vector<std::string_view> names;
  for (const auto& h : req.headers) names.push_back(h.name);
  EXPECT_EQ(names, (std::vector<std::string_view>{"Host", "Corral-Principal", "My_Header",
                                                  "Forwarded_X", "X_Forwarded", "X-Ordinary"}));
  // Dropped from a relay too: a relay never sends them (nginx ignores such names by default).
  policy_.relays = {relay("127.0.0.0/8")};
  Request relayed = request("/", {{"Host", "localhost"}, {"X_Forwarded_For", "1.2.3.4"}});
  a = admit_from(relayed);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(a.dropped_headers, 1);
  EXPECT_EQ(relayed.remote_address, "127.0.0.1");
}

TEST_F(AdmissionTest, XForwardedForFromRelay) {
  policy_.relays = {relay("127.0.0.0/8")};
  Request req = request("/", {{"Host", "example.com"},
                              {"X-Forwarded-For", "6.6.6.6, 203.0.113.7"},
                              {"X-Forwarded-Proto", "https"}});
  ASSERT_EQ(admit_from(req).status, 0);
  EXPECT_EQ(req.remote_address, "203.0.113.7");
  EXPECT_EQ(req.scheme, "https");
  EXPECT_EQ(req.host, "example.com");

  // Entries that are relays themselves are skipped, from the right; several lines are one list.
  Request chain = request("/", {{"Host", "localhost"},
                                {"X-Forwarded-For", "198.51.100.1, 203.0.113.9"},
                                {"X-Forwarded-For", "127.0.0.5"},
                                {"X-Forwarded-Proto", "http"}});
  ASSERT_EQ(admit_from(chain).status, 0);
  EXPECT_EQ(chain.remote_address, "203.0.113.9");
  EXPECT_EQ(chain.scheme, "http");

  Request v6 = request("/", {{"Host", "localhost"}, {"X-Forwarded-For", "[2001:DB8::7]:1234"}});
  ASSERT_EQ(admit_from(v6).status, 0);
  EXPECT_EQ(v6.remote_address, "2001:db8::7");

  Request port = request("/", {{"Host", "localhost"}, {"X-Forwarded-For", "203.0.113.7:5555"}});
  ASSERT_EQ(admit_from(port).status, 0);
  EXPECT_EQ(port.remote_address, "203.0.113.7");

  // Proto alone: the address stays the relay's.
  Request proto = request("/", {{"Host", "localhost"}, {"X-Forwarded-Proto", "https"}});
  ASSERT_EQ(admit_from(proto).status, 0);
  EXPECT_EQ(proto.remote_address, "127.0.0.1");
  EXPECT_EQ(proto.scheme, "https");

  Request real_ip = request("/", {{"Host", "localhost"}, {"X-Real-IP", "203.0.113.8"}});
  ASSERT_EQ(admit_from(real_ip).status, 0);
  EXPECT_EQ(real_ip.remote_address, "203.0.113.8");
}

TEST_F(AdmissionTest, MalformedXForwardedFromRelay) {
  policy_.relays = {relay("127.0.0.1")};
  auto status = [&](std::string_view name, std::string_view value) {
    Request req = request("/", {{"Host", "localhost"}, {name, value}});
    return admit_from(req).status;
  };
  EXPECT_EQ(status("X-Forwarded-For", "not-an-ip"), 400);
  EXPECT_EQ(status("X-Forwarded-For", "1.2.3.4, unknown"), 400);
  EXPECT_EQ(status("X-Forwarded-For", "1.2.3.4:99999"), 400);
  EXPECT_EQ(status("X-Forwarded-For", "[::1"), 400);
  EXPECT_EQ(status("X-Forwarded-Proto", "ftp"), 400);
  EXPECT_EQ(status("X-Forwarded-Proto", "https "), 0);
  EXPECT_EQ(status("X-Real-IP", "garbage"), 400);
  // Only the chosen (rightmost non-relay) entry matters: garbage further left is the client's.
  EXPECT_EQ(status("X-Forwarded-For", "garbage, 1.2.3.4"), 0);
  // X-Forwarded-Host is accepted from a relay but not used: the Host header is what is checked.
  EXPECT_EQ(status("X-Forwarded-Host", "evil.com"), 0);
}

TEST_F(AdmissionTest, ForwardedFromRelay) {
  policy_.relays = {relay("127.0.0.0/8")};
  Request req =
      request("/", {{"Host", "localhost"},
                    {"Forwarded", "for=192.0.2.43, for=\"[2001:db8::1]:4711\";proto=https"}});
  ASSERT_EQ(admit_from(req).status, 0);
  EXPECT_EQ(req.remote_address, "2001:db8::1");
  EXPECT_EQ(req.scheme, "https");

  // The last element wins; case-insensitive names; X-Forwarded-* is ignored when Forwarded is
  // present.
  Request last = request("/", {{"Host", "localhost"},
                               {"Forwarded", "for=198.51.100.1;proto=https"},
                               {"Forwarded", "For=\"192.0.2.60:8080\";PROTO=http;by=203.0.113.43"},
                               {"X-Forwarded-For", "6.6.6.6"}});
  ASSERT_EQ(admit_from(last).status, 0);
  EXPECT_EQ(last.remote_address, "192.0.2.60");
  EXPECT_EQ(last.scheme, "http");

  // "unknown" and obfuscated identifiers keep the relay's address.
  for (std::string_view v : {"for=unknown", "for=_hidden", "for=\"_hidden:_port\"",
                             "for=\"unknown:80\"", "proto=https", "for=\"[::1]\";host=a.b"}) {
    Request r = request("/", {{"Host", "localhost"}, {"Forwarded", v}});
    ASSERT_EQ(admit_from(r, "127.0.0.2:1").status, 0) << v;
    EXPECT_EQ(r.remote_address, v.find("::1") == v.npos ? "127.0.0.2" : "::1") << v;
  }
  // A relay in the chain is skipped (for= names a relay address).
  Request chain = request(
      "/", {{"Host", "localhost"}, {"Forwarded", "for=203.0.113.1;proto=https, for=127.0.0.9"}});
  ASSERT_EQ(admit_from(chain).status, 0);
  EXPECT_EQ(chain.remote_address, "203.0.113.1");
  EXPECT_EQ(chain.scheme, "https");
  // Quoted-pairs are unescaped.
  Request escaped = request("/", {{"Host", "localhost"}, {"Forwarded", "for=\"\\1.2.3.4\""}});
  ASSERT_EQ(admit_from(escaped).status, 0);
  EXPECT_EQ(escaped.remote_address, "1.2.3.4");
}

TEST_F(AdmissionTest, MalformedForwardedFromRelay) {
  policy_.relays = {relay("127.0.0.1")};
  for (std::string_view v :
       {"for=[2001:db8::1]", "for=192.0.2.60:8080", "for=\"[2001:db8::1]", "for=", "for",
        "=1.2.3.4", "for=1.2.3.4;for=5.6.7.8", "for=1.2.3.4 x", "for=\"1.2.3\"", "for=\"_\"",
        "for=\"1.2.3.4:\"", "for=\"[::1]:99999\"", "proto=ftp",
        "for=1.2.3.4;proto=https;proto=http", "for=\"garbage\"", "for=\"[v1.x]\""}) {
    Request req = request("/", {{"Host", "localhost"}, {"Forwarded", v}});
    Admission a = admit_from(req);
    EXPECT_EQ(a.status, 400) << v;
  }
}

TEST_F(AdmissionTest, ChecksRunInOrder) {
  // Target before Host, Host before forwarding headers.
  Request a = request("/..", {{"Host", "evil.com"}, {"X-Forwarded-For", "1.2.3.4"}});
  EXPECT_EQ(admit_from(a).status, 400);
  Request b = request("/", {{"Host", "evil.com"}, {"X-Forwarded-For", "1.2.3.4"}});
  EXPECT_EQ(admit_from(b).status, 403);
  EXPECT_EQ(admit_from(b).reason.rfind("host not allowed: ", 0), 0u);
  EXPECT_NE(admit_from(b).reason.find("allowed_hosts (or --allowed-host"), std::string_view::npos);
}

TEST_F(AdmissionTest, NonLoopbackPeerAndMappedAddresses) {
  Request req = request("/", {{"Host", "example.com"}});
  ASSERT_EQ(admit_from(req, "[2001:db8::5]:1").status, 0);
  EXPECT_EQ(req.remote_address, "2001:db8::5");
  // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d: seen as IPv4, matched by v4 relays.
  policy_.relays = {relay("10.0.0.0/8")};
  Request mapped = request("/", {{"Host", "example.com"}, {"X-Forwarded-For", "1.2.3.4"}});
  ASSERT_EQ(admit_from(mapped, "[::ffff:10.1.2.3]:1").status, 0);
  EXPECT_EQ(mapped.remote_address, "1.2.3.4");
  Request plain = request("/", {{"Host", "example.com"}});
  ASSERT_EQ(admit_from(plain, "[::ffff:10.1.2.3]:1").status, 0);
  EXPECT_EQ(plain.remote_address, "10.1.2.3");
}

TEST(AdmissionRelay, Parse) {
  EXPECT_TRUE(relay("127.0.0.1").contains(*IpAddress::parse("127.0.0.1")));
  EXPECT_FALSE(relay("127.0.0.1").contains(*IpAddress::parse("127.0.0.2")));
  Relay ten = relay("10.0.0.0/8");
  EXPECT_TRUE(ten.contains(*IpAddress::parse("10.255.1.2")));
  EXPECT_FALSE(ten.contains(*IpAddress::parse("11.0.0.1")));
  EXPECT_FALSE(ten.contains(*IpAddress::parse("::ffff:10.0.0.1")));  // parsed text stays v6
  Relay odd = relay("192.168.0.0/17");
  EXPECT_TRUE(odd.contains(*IpAddress::parse("192.168.127.255")));
  EXPECT_FALSE(odd.contains(*IpAddress::parse("192.168.128.0")));
  EXPECT_TRUE(relay("::1").contains(*IpAddress::parse("::1")));
  EXPECT_TRUE(relay("[::1]").contains(*IpAddress::parse("::1")));
  Relay fd = relay("fd00::/8");
  EXPECT_TRUE(fd.contains(*IpAddress::parse("fd12:3456::1")));
  EXPECT_FALSE(fd.contains(*IpAddress::parse("fe80::1")));
  EXPECT_FALSE(fd.contains(*IpAddress::parse("10.0.0.1")));
  EXPECT_TRUE(relay("0.0.0.0/0").contains(*IpAddress::parse("8.8.8.8")));
  EXPECT_TRUE(relay("::/0").contains(*IpAddress::parse("2001:db8::1")));
  for (std::string_view bad : {"", "localhost", "10.0.0.0/33", "10.0.0.0/", "10.1.0.0/8", "::1/129",
                               "10.0.0.0/8x", "1.2.3", "01.2.3.4", "[::1"}) {
    auto r = parse_relay(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.error().reason.find("invalid relay"), std::string::npos);
    }
  }
}

TEST(AdmissionHost, Helpers) {
  EXPECT_EQ(host_without_port("example.com:8080"), "example.com");
  EXPECT_EQ(host_without_port("example.com"), "example.com");
  EXPECT_EQ(host_without_port("[::1]:8080"), "[::1]");
  EXPECT_EQ(host_without_port("[::1]"), "[::1]");
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_TRUE(is_loopback_host("127.255.0.1"));
  EXPECT_TRUE(is_loopback_host("[::1]"));
  EXPECT_FALSE(is_loopback_host("localhost:80"));  // takes a host without port
  EXPECT_FALSE(is_loopback_host("localhost."));
  EXPECT_FALSE(is_loopback_host("[::2]"));
  EXPECT_FALSE(is_loopback_host("0x7f.0.0.1"));
  EXPECT_FALSE(is_loopback_host("2130706433"));  // 127.0.0.1 as one number: not a dotted quad

  EXPECT_EQ(normalize_allowed_host("Example.COM").value(), "example.com");
  EXPECT_EQ(normalize_allowed_host("2001:DB8:0::1").value(), "[2001:db8::1]");
  EXPECT_EQ(normalize_allowed_host("[2001:db8::1]").value(), "[2001:db8::1]");
  EXPECT_EQ(normalize_allowed_host("192.0.2.1").value(), "192.0.2.1");
  for (std::string_view bad : {"", "example.com:80", "a b", "a@b", "[::1]:80", "[::1"})
    EXPECT_FALSE(normalize_allowed_host(bad).ok()) << bad;
}

TEST(CorralView, TheProxysHostAndSchemeBecomeTheRequests) {
  Request req;
  req.host = "localhost";
  req.headers.add("Corral-Host", "notes.example:8443");
  req.headers.add("Corral-Scheme", "https");
  take_corral_view(req);
  EXPECT_EQ(req.host, "notes.example:8443");
  EXPECT_EQ(req.scheme, "https");
}

TEST(CorralView, AbsentOrInvalidFieldsChangeNothing) {
  Request none;
  none.host = "localhost";
  take_corral_view(none);
  EXPECT_EQ(none.host, "localhost");
  EXPECT_EQ(none.scheme, "http");
  Request bad;
  bad.host = "localhost";
  bad.headers.add("Corral-Host", "a b");  // not a Host
  bad.headers.add("Corral-Scheme", "gopher");
  take_corral_view(bad);
  EXPECT_EQ(bad.host, "localhost");
  EXPECT_EQ(bad.scheme, "http");
}

TEST(AdmissionPolicyChange, StillAdmitted) {
  AdmissionPolicy before;
  before.allowed_hosts = {"a.example", "b.example"};
  AdmissionPolicy after;
  after.allowed_hosts = {"b.example"};
  EXPECT_TRUE(still_admitted("a.example:8080", before));
  EXPECT_FALSE(still_admitted("a.example:8080", after));
  EXPECT_TRUE(still_admitted("B.example", after));
  EXPECT_TRUE(still_admitted("localhost:1", after));
  EXPECT_TRUE(still_admitted("", after));  // HTTP/1.0 without Host
}

TEST(AdmissionPeer, FromSocketAddress) {
  Peer p = Peer::from(address("127.0.0.1:9"));
  EXPECT_EQ(p.text(), "127.0.0.1");
  Peer v6 = Peer::from(address("[::1]:9"));
  EXPECT_EQ(v6.text(), "::1");
  Peer mapped = Peer::from(address("[::ffff:192.0.2.1]:9"));
  EXPECT_EQ(mapped.text(), "192.0.2.1");
  EXPECT_EQ(mapped.ip.family, AF_INET);
}

}  // namespace
}  // namespace corral::http
