// The etcd gateway codec: base64 both ways, prefix ends, each request's JSON, each response decoded
// from what etcd 3.4's gateway sends (bodies copied from a real one), the stream lines of watch
// and keep-alive, errors, and input that is not what the gateway sends.
#include "cluster/etcd_codec.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace corral::cluster {
namespace {

using nlohmann::json;

TEST(Base64, RoundTripsEveryLength) {
  std::string raw;
  for (int i = 0; i < 40; ++i) {
    auto text = base64_encode(raw);
    EXPECT_EQ(text.size() % 4, 0u);
    auto back = base64_decode(text);
    ASSERT_TRUE(back) << text;
    EXPECT_EQ(*back, raw);
    raw.push_back(static_cast<char>(i * 37 + 200));
  }
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("a"), "YQ==");
  EXPECT_EQ(*base64_decode("YQ"), "a");  // unpadded is read too
}

TEST(Base64, RejectsWhatIsNotBase64) {
  EXPECT_FALSE(base64_decode("Y"));
  EXPECT_FALSE(base64_decode("YQ=a"));
  EXPECT_FALSE(base64_decode("Y!=="));
  EXPECT_FALSE(base64_decode("YR=="));  // non-zero leftover bits
}

TEST(PrefixEnd, IncrementsTheLastByteBelowFF) {
  EXPECT_EQ(prefix_end("app/nodes/"), "app/nodes0");
  EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

TEST(Encode, RangePutDeleteUseBase64AndStringIntegers) {
  RangeRequest r{.key = "a/", .range_end = prefix_end("a/"), .limit = 5};
  EXPECT_EQ(json::parse(encode(r)),
            json::parse(R"({"key":"YS8=","range_end":"YTA=","limit":"5"})"));
  PutRequest p{.key = "k", .value = "v", .lease = 7587862115012383490};
  EXPECT_EQ(json::parse(encode(p)),
            json::parse(R"({"key":"aw==","value":"dg==","lease":"7587862115012383490"})"));
  DeleteRangeRequest d{.key = "k", .prev_kv = true};
  EXPECT_EQ(json::parse(encode(d)), json::parse(R"({"key":"aw==","prev_kv":true})"));
}

TEST(Encode, TxnCarriesCompareSuccessFailure) {
  TxnRequest t;
  t.compare.push_back({.key = "o",
                       .result = Compare::Result::kEqual,
                       .target = Compare::Target::kCreate,
                       .number = 0});
  t.compare.push_back({.key = "o",
                       .result = Compare::Result::kNotEqual,
                       .target = Compare::Target::kValue,
                       .value = "x"});
  t.success.emplace_back(PutRequest{.key = "o", .value = "n1", .lease = 9});
  t.failure.emplace_back(RangeRequest{.key = "o"});
  t.failure.emplace_back(DeleteRangeRequest{.key = "f"});
  auto j = json::parse(encode(t));
  EXPECT_EQ(
      j["compare"][0],
      json::parse(R"({"key":"bw==","result":"EQUAL","target":"CREATE","create_revision":"0"})"));
  EXPECT_EQ(j["compare"][1],
            json::parse(R"({"key":"bw==","result":"NOT_EQUAL","target":"VALUE","value":"eA=="})"));
  EXPECT_EQ(j["success"][0],
            json::parse(R"({"request_put":{"key":"bw==","value":"bjE=","lease":"9"}})"));
  EXPECT_EQ(j["failure"][0], json::parse(R"({"request_range":{"key":"bw=="}})"));
  EXPECT_EQ(j["failure"][1], json::parse(R"({"request_delete_range":{"key":"Zg=="}})"));
}

TEST(Encode, LeaseAndWatch) {
  EXPECT_EQ(json::parse(encode_lease_grant(10)), json::parse(R"({"TTL":"10"})"));
  EXPECT_EQ(json::parse(encode_lease_keepalive(42)), json::parse(R"({"ID":"42"})"));
  EXPECT_EQ(json::parse(encode_lease_revoke(42)), json::parse(R"({"ID":"42"})"));
  WatchRequest w{.key = "a", .range_end = "b", .start_revision = 12, .prev_kv = true};
  EXPECT_EQ(json::parse(encode(w)),
            json::parse(R"({"create_request":{"key":"YQ==","range_end":"Yg==",
                           "start_revision":"12","prev_kv":true}})"));
}

constexpr const char* kHeader =
    R"("header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437",)"
    R"("revision":"3","raft_term":"2"})";

TEST(Decode, RangeFromTheGateway) {
  auto r =
      decode_range(std::string("{") + kHeader +
                   R"(,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3",)"
                   R"("version":"2","value":"YmFy","lease":"7587862115012383490"}],"count":"1"})");
  ASSERT_TRUE(r) << r.error().reason;
  EXPECT_EQ(r->header.revision, 3);
  EXPECT_EQ(r->header.cluster_id, 14841639068965178418u);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "foo");
  EXPECT_EQ(r->kvs[0].value, "bar");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 3);
  EXPECT_EQ(r->kvs[0].lease, 7587862115012383490);
  EXPECT_EQ(r->count, 1);
  // No key: no kvs, no count.
  auto empty = decode_range(std::string("{") + kHeader + "}");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->kvs.empty());
}

TEST(Decode, TxnSucceededAndFailed) {
  auto ok = decode_txn(
      std::string("{") + kHeader +
      R"(,"succeeded":true,"responses":[{"response_put":{"header":{"revision":"3"}}}]})");
  ASSERT_TRUE(ok) << ok.error().reason;
  EXPECT_TRUE(ok->succeeded);
  ASSERT_EQ(ok->responses.size(), 1u);
  EXPECT_EQ(std::get<PutResponse>(ok->responses[0]).header.revision, 3);

  auto failed = decode_txn(
      std::string("{") + kHeader +
      R"(,"responses":[{"response_range":{"header":{"revision":"3"},"kvs":[{"key":"YQ==",)"
      R"("create_revision":"3","mod_revision":"3","version":"1","value":"MQ=="}],"count":"1"}},)"
      R"({"response_delete_range":{"header":{},"deleted":"1"}}]})");
  ASSERT_TRUE(failed) << failed.error().reason;
  EXPECT_FALSE(failed->succeeded);
  ASSERT_EQ(failed->responses.size(), 2u);
  const auto& range = std::get<RangeResponse>(failed->responses[0]);
  ASSERT_EQ(range.kvs.size(), 1u);
  EXPECT_EQ(range.kvs[0].value, "1");
  EXPECT_EQ(std::get<DeleteRangeResponse>(failed->responses[1]).deleted, 1);
}

TEST(Decode, Leases) {
  auto grant =
      decode_lease_grant(std::string("{") + kHeader + R"(,"ID":"2324035844600792328","TTL":"5"})");
  ASSERT_TRUE(grant);
  EXPECT_EQ(grant->id, 2324035844600792328);
  EXPECT_EQ(grant->ttl, 5);
  EXPECT_FALSE(decode_lease_grant(std::string("{") + kHeader + R"(,"error":"no"})"));

  auto alive = decode_lease_keepalive(std::string(R"({"result":{)") + kHeader +
                                      R"(,"ID":"123","TTL":"10"}})");
  ASSERT_TRUE(alive);
  EXPECT_EQ(alive->ttl, 10);
  // A lease etcd does not know: no TTL.
  auto gone = decode_lease_keepalive(std::string(R"({"result":{)") + kHeader + R"(,"ID":"123"}})");
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->ttl, 0);
  EXPECT_TRUE(decode_lease_revoke(std::string("{") + kHeader + "}"));
}

TEST(Decode, WatchLines) {
  auto created = decode_watch(std::string(R"({"result":{)") + kHeader + R"(,"created":true}})");
  ASSERT_TRUE(created);
  EXPECT_TRUE(created->created);
  EXPECT_TRUE(created->events.empty());

  auto events = decode_watch(
      std::string(R"({"result":{)") + kHeader +
      R"(,"events":[{"kv":{"key":"YQ==","create_revision":"3","mod_revision":"3","version":"1",)"
      R"("value":"MQ=="}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"4"},)"
      R"("prev_kv":{"key":"YQ==","value":"MQ=="}}]}})");
  ASSERT_TRUE(events) << events.error().reason;
  ASSERT_EQ(events->events.size(), 2u);
  EXPECT_EQ(events->events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(events->events[0].kv.value, "1");
  EXPECT_EQ(events->events[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(events->events[1].kv.mod_revision, 4);
  ASSERT_TRUE(events->events[1].prev_kv);
  EXPECT_EQ(events->events[1].prev_kv->value, "1");

  auto compacted = decode_watch(std::string(R"({"result":{)") + kHeader +
                                R"(,"canceled":true,"compact_revision":"2"}})");
  ASSERT_TRUE(compacted);
  EXPECT_EQ(compacted->compact_revision, 2);

  auto error = decode_watch(R"({"error":{"grpc_code":14,"http_code":503,"message":"down",)"
                            R"("http_status":"Service Unavailable"}})");
  ASSERT_FALSE(error);
  EXPECT_EQ(error.error().code, kEtcdError + kGrpcUnavailable);
}

TEST(Decode, GatewayErrors) {
  auto e = decode_error(400, R"({"error":"etcdserver: requested lease not found",)"
                             R"("message":"etcdserver: requested lease not found","code":5})");
  EXPECT_EQ(e.code, kEtcdError + kGrpcNotFound);
  EXPECT_NE(e.reason.find("lease not found"), std::string::npos);
  EXPECT_EQ(decode_error(502, "<html>bad gateway</html>").code, kMalformed);
}

TEST(Decode, RejectsWhatTheGatewayDoesNotSend) {
  EXPECT_FALSE(decode_range("not json"));
  EXPECT_FALSE(decode_range("[]"));
  EXPECT_FALSE(decode_range(R"({"kvs":{"key":"YQ=="}})"));
  EXPECT_FALSE(decode_range(R"({"kvs":[{"key":"!!"}]})"));
  EXPECT_FALSE(decode_range(R"({"kvs":[{"key":"YQ==","create_revision":"x"}]})"));
  EXPECT_FALSE(
      decode_range(R"({"kvs":[{"key":"YQ==","create_revision":"99999999999999999999"}]})"));
  EXPECT_FALSE(decode_range(R"({"header":{"revision":true}})"));
  EXPECT_FALSE(decode_txn(R"({"responses":[{"response_txn":{}}]})"));
  EXPECT_FALSE(decode_watch(R"({"result":{"events":[{"type":"NOPE"}]}})"));
  EXPECT_FALSE(decode_watch(R"({"nothing":1})"));
  // Numbers where strings are expected are read (protobuf's JSON allows both).
  auto n = decode_range(R"({"header":{"revision":7},"count":1})");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->header.revision, 7);
}

TEST(LineSplitter, CutsLinesAcrossFeeds) {
  LineSplitter s;
  ASSERT_TRUE(s.feed("{\"a\":1}\n{\"b\""));
  auto first = s.next_line();
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, "{\"a\":1}");
  EXPECT_FALSE(s.next_line());
  ASSERT_TRUE(s.feed(":2}\r\n\n"));
  auto second = s.next_line();
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, "{\"b\":2}");
  EXPECT_FALSE(s.next_line());
}

TEST(LineSplitter, BreaksOnALineTooLong) {
  LineSplitter s(8);
  EXPECT_TRUE(s.feed("12345678"));
  EXPECT_FALSE(s.feed("9"));
  EXPECT_FALSE(s.next_line());
  EXPECT_FALSE(s.feed("\n"));
}

}  // namespace
}  // namespace corral::cluster
