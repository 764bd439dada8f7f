// The etcd v3 JSON gateway, as a sans-IO codec (STYLE rule 2): the operations corral uses as plain
// structs, each request encoded to the JSON body the gateway's POST takes, each response body
// decoded back. No sockets, no timers: the Client (etcd_client.h) sends what encode() makes and
// hands decode() what comes back; the unit test and the fuzzer feed decode() anything.
//
// The gateway speaks protobuf's JSON mapping of etcd's gRPC API (etcd 3.4): keys and values are
// base64 (encode and decode do that: the structs hold raw bytes), 64-bit integers are JSON strings
// (numbers are accepted too), fields at their default value are left out (a PUT event has no
// "type"; a lease the server does not know comes back without a "TTL"). A failed call answers a
// non-200 status with {"error", "code", "message"}: decode_error turns it into an Error whose code
// is kEtcdError + the gRPC code. Streaming calls (watch, lease keep-alive) answer one JSON object
// per line, {"result": ...} or {"error": ...}; LineSplitter cuts a stream into those lines.
//
// Decoding never throws and never trusts the input: a missing field is its default, a field of
// the wrong type or a string that is not base64 or not a number is a kMalformed error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/result.h"

namespace corral::cluster {

// Error codes of this component (beside errno values for the transport).
inline constexpr int kMalformed = 10000;  // a response that is not what the gateway sends
inline constexpr int kEtcdError = 20000;  // + the gRPC status code of a failed call
inline constexpr int kGrpcNotFound = 5;   // e.g. "etcdserver: requested lease not found"
inline constexpr int kGrpcUnavailable = 14;

std::string base64_encode(std::string_view raw);
std::optional<std::string> base64_decode(std::string_view text);

// The end of the range of every key that starts with `prefix` (etcd's "prefix" range_end): the
// prefix with its last byte below 0xff incremented and what follows it dropped; "\0" (every key)
// for an empty or all-0xff prefix.
std::string prefix_end(std::string_view prefix);

struct ResponseHeader {
  uint64_t cluster_id = 0;
  uint64_t member_id = 0;
  int64_t revision = 0;
  uint64_t raft_term = 0;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeRequest {
  std::string key;
  std::string range_end;  // empty: the one key
  int64_t limit = 0;
  int64_t revision = 0;  // 0: the newest
  bool keys_only = false;
  bool count_only = false;
};
struct PutRequest {
  std::string key;
  std::string value;
  int64_t lease = 0;
  bool prev_kv = false;
};
struct DeleteRangeRequest {
  std::string key;
  std::string range_end;
  bool prev_kv = false;
};

struct Compare {
  enum class Result : uint8_t { kEqual, kGreater, kLess, kNotEqual };
  enum class Target : uint8_t { kVersion, kCreate, kMod, kValue, kLease };
  std::string key;
  Result result = Result::kEqual;
  Target target = Target::kVersion;
  int64_t number = 0;  // version, create or mod revision, lease: per target
  std::string value;   // Target::kValue
};
using RequestOp = std::variant<RangeRequest, PutRequest, DeleteRangeRequest>;
struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<RequestOp> success;
  std::vector<RequestOp> failure;
};

struct RangeResponse {
  ResponseHeader header;
  std::vector<KeyValue> kvs;
  bool more = false;
  int64_t count = 0;
};
struct PutResponse {
  ResponseHeader header;
  std::optional<KeyValue> prev_kv;
};
struct DeleteRangeResponse {
  ResponseHeader header;
  int64_t deleted = 0;
  std::vector<KeyValue> prev_kvs;
};
using ResponseOp = std::variant<RangeResponse, PutResponse, DeleteRangeResponse>;
struct TxnResponse {
  ResponseHeader header;
  bool succeeded = false;
  std::vector<ResponseOp> responses;  // of success when succeeded, of failure otherwise
};

struct LeaseGrantResponse {
  ResponseHeader header;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds
};
struct LeaseKeepAliveResponse {
  ResponseHeader header;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds; 0: the lease is gone (expired or revoked)
};
struct LeaseRevokeResponse {
  ResponseHeader header;
};

struct WatchRequest {
  std::string key;
  std::string range_end;
  int64_t start_revision = 0;  // 0: from now on
  bool prev_kv = false;
  bool progress_notify = false;
};
struct WatchEvent {
  enum class Type : uint8_t { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;
  std::optional<KeyValue> prev_kv;
};
struct WatchResponse {
  ResponseHeader header;
  int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;  // > 0: the start revision was compacted away
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

// The gateway paths.
inline constexpr std::string_view kRangePath = "/v3/kv/range";
inline constexpr std::string_view kPutPath = "/v3/kv/put";
inline constexpr std::string_view kTxnPath = "/v3/kv/txn";
inline constexpr std::string_view kDeleteRangePath = "/v3/kv/deleterange";
inline constexpr std::string_view kLeaseGrantPath = "/v3/lease/grant";
inline constexpr std::string_view kLeaseKeepAlivePath = "/v3/lease/keepalive";
inline constexpr std::string_view kLeaseRevokePath = "/v3/lease/revoke";
inline constexpr std::string_view kWatchPath = "/v3/watch";

std::string encode(const RangeRequest& r);
std::string encode(const PutRequest& r);
std::string encode(const DeleteRangeRequest& r);
std::string encode(const TxnRequest& r);
std::string encode_lease_grant(int64_t ttl_s);
std::string encode_lease_keepalive(int64_t id);
std::string encode_lease_revoke(int64_t id);
std::string encode(const WatchRequest& r);  // a create_request

core::Result<RangeResponse> decode_range(std::string_view body);
core::Result<PutResponse> decode_put(std::string_view body);
core::Result<DeleteRangeResponse> decode_delete_range(std::string_view body);
core::Result<TxnResponse> decode_txn(std::string_view body);
core::Result<LeaseGrantResponse> decode_lease_grant(std::string_view body);
core::Result<LeaseRevokeResponse> decode_lease_revoke(std::string_view body);
// One line of a stream ({"result": ...}, or {"error": ...}: an Error).
core::Result<LeaseKeepAliveResponse> decode_lease_keepalive(std::string_view line);
core::Result<WatchResponse> decode_watch(std::string_view line);
// The body of a non-200 answer: {"error", "code", "message"} (kEtcdError + code), or kMalformed.
core::Error decode_error(int status, std::string_view body);

// Cuts a byte stream into newline-terminated lines (the newline dropped; blank lines skipped).
// A line longer than max_line is an error: the stream is broken, the caller drops it.
class LineSplitter {
 public:
  static constexpr size_t kDefaultMaxLine = 16 * 1024 * 1024;
  explicit LineSplitter(size_t max_line = kDefaultMaxLine) : max_line_(max_line) {}

  // Appends `data`; false once a line is too long (and from then on).
  bool feed(std::string_view data);
  // The next complete line, valid until the next feed() or next_line(); nullopt when none.
  std::optional<std::string_view> next_line();
  void clear() {
    buf_.clear();
    pos_ = 0;
    broken_ = false;
  }

 private:
  std::string buf_;
  size_t pos_ = 0;  // where the unread bytes start
  size_t max_line_;
  bool broken_ = false;
};

}  // namespace corral::cluster
