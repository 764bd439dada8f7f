#include "control/admin.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace corral::control {
namespace {

http::IpAddress ip(const char* text) {
  return *http::IpAddress::parse(text);
}

http::Request request(http::Method m, const char* host = "127.0.0.1:8081") {
  http::Request r;
  r.method = m;
  r.host = host;
  return r;
}

TEST(AdminCheck, LoopbackOnlyWithoutAllow) {
  AdminAccess a;
  auto get = request(http::Method::kGet);
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), get).status, 0);
  EXPECT_EQ(admin_check(a, ip("127.9.8.7"), get).status, 0);
  EXPECT_EQ(admin_check(a, ip("::1"), get).status, 0);
  EXPECT_EQ(admin_check(a, ip("10.1.2.3"), get).status, 403);
  EXPECT_EQ(admin_check(a, ip("192.168.0.1"), get).status, 403);
  EXPECT_EQ(admin_check(a, ip("2001:db8::1"), get).status, 403);
}

TEST(AdminCheck, AllowNeedsTheTokenOnEveryRequest) {
  AdminAccess a;
  a.allow.push_back(*http::parse_relay("10.0.0.0/8"));
  a.token = "s3cret-token";
  auto get = request(http::Method::kGet);
  EXPECT_EQ(admin_check(a, ip("10.1.2.3"), get).status, 401);
  get.headers.add("Authorization", "Bearer s3cret-tokeN");
  EXPECT_EQ(admin_check(a, ip("10.1.2.3"), get).status, 401);
  auto good = request(http::Method::kGet);
  good.headers.add("Authorization", "bearer s3cret-token");
  EXPECT_EQ(admin_check(a, ip("10.1.2.3"), good).status, 0);
  // Outside the CIDRs, and loopback is not implied by them: refused whatever the token.
  EXPECT_EQ(admin_check(a, ip("11.0.0.1"), good).status, 403);
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), good).status, 403);
  // With the token a POST needs no Origin.
  auto post = request(http::Method::kPost);
  post.headers.add("Authorization", "Bearer s3cret-token");
  EXPECT_EQ(admin_check(a, ip("10.1.2.3"), post).status, 0);
}

TEST(AdminCheck, MutatingNeedsSameOriginOrToken) {
  AdminAccess a;
  auto bare = request(http::Method::kPost);
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), bare).status, 403);
  auto cross = request(http::Method::kPost);
  cross.headers.add("Origin", "http://evil.example");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), cross).status, 403);
  auto other_port = request(http::Method::kDelete);
  other_port.headers.add("Origin", "http://127.0.0.1:8080");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), other_port).status, 403);
  auto null_origin = request(http::Method::kPost);
  null_origin.headers.add("Origin", "null");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), null_origin).status, 403);
  auto same = request(http::Method::kPost);
  same.headers.add("Origin", "http://127.0.0.1:8081");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), same).status, 0);
  auto fetch_cross = request(http::Method::kPut);
  fetch_cross.headers.add("Sec-Fetch-Site", "cross-site");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), fetch_cross).status, 403);
  auto fetch_same = request(http::Method::kPut);
  fetch_same.headers.add("Sec-Fetch-Site", "same-origin");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), fetch_same).status, 0);
  // Origin decides when both are there.
  auto both = request(http::Method::kPost);
  both.headers.add("Origin", "http://evil.example");
  both.headers.add("Sec-Fetch-Site", "same-origin");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), both).status, 403);
  // A configured token also lets a POST through; a wrong one is 401.
  a.token = "t";
  auto token = request(http::Method::kPost);
  token.headers.add("Authorization", "Bearer t");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), token).status, 0);
  auto wrong = request(http::Method::kGet);
  wrong.headers.add("Authorization", "Bearer u");
  EXPECT_EQ(admin_check(a, ip("127.0.0.1"), wrong).status, 401);
}

TEST(AdminCheck, TokensEqual) {
  EXPECT_TRUE(tokens_equal("abc", "abc"));
  EXPECT_FALSE(tokens_equal("abc", "abd"));
  EXPECT_FALSE(tokens_equal("abc", "abcd"));
  EXPECT_FALSE(tokens_equal("", "a"));
}

TEST(AdminToken, ReadTrimmedOrError) {
  std::string path = ::testing::TempDir() + "/admin_token_test";
  std::ofstream(path) << "  tok-1\n";
  auto t = read_token_file(path);
  ASSERT_TRUE(t);
  EXPECT_EQ(t.value(), "tok-1");
  std::ofstream(path) << "\n";
  EXPECT_FALSE(read_token_file(path));
  std::remove(path.c_str());
  auto missing = read_token_file(path);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().reason.find(path), std::string::npos);
}

}  // namespace
}  // namespace corral::control
