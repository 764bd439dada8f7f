#include "cluster/node.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

namespace corral::cluster {

// Follows <name>/nodes/ for the Node: events update the member list; a compaction reads it again.
class Node::MembersWatch final : public WatchHandler {
 public:
  explicit MembersWatch(Node& node) : node_(node) {}
  void on_watch(const WatchResponse& r) override {
    if (r.events.empty()) return;
    std::string prefix = node_.nodes_prefix();
    for (const auto& ev : r.events) {
      if (!ev.kv.key.starts_with(prefix)) continue;
      std::string name = ev.kv.key.substr(prefix.size());
      if (ev.type == WatchEvent::Type::kPut) {
        node_.members_[name] = Member{ev.kv.value, ev.kv.lease};
      } else {
        node_.members_.erase(name);
      }
    }
    node_.events_.on_members(node_.members_);
  }
  void on_compacted(int64_t /*compact_revision*/) override {
    node_.members_watch_.reset();
    node_.read_members();
  }

 private:
  Node& node_;
};

Node::Node(Client& client, NodeOptions options, Events& events)
    : client_(client), options_(std::move(options)), events_(events) {
  if (options_.ttl_s < 1) options_.ttl_s = 1;
  uint64_t ttl_ms = static_cast<uint64_t>(options_.ttl_s) * 1000;
  if (options_.keepalive_ms == 0) options_.keepalive_ms = ttl_ms / 3;
  if (options_.margin_ms == 0) options_.margin_ms = std::max<uint64_t>(ttl_ms / 5, 500);
  keepalive_timer_.bind(loop().timers(), [this] { send_keepalive(); });
  trust_timer_.bind(loop().timers(), [this] {
    if (published_ && loop().now() >= trusted_until_) lose_trust("no keep-alive answered in time");
  });
  grant_timer_.bind(loop().timers(), [this] { grant(); });
  members_timer_.bind(loop().timers(), [this] { read_members(); });
}

Node::~Node() {
  client_.cancel(this);
}

void Node::start() {
  if (started_) return;
  started_ = true;
  grant();
  read_members();
}

bool Node::trusted() const {
  return published_ && client_.loop().now() < trusted_until_;
}

std::string Node::node_key(std::string_view node) const {
  return nodes_prefix() + std::string(node);
}
std::string Node::nodes_prefix() const {
  return options_.name + "/nodes/";
}
std::string Node::owner_key(std::string_view address) const {
  return options_.name + "/addresses/" + std::string(address) + "/owner";
}
std::string Node::failed_key(std::string_view address) const {
  return options_.name + "/addresses/" + std::string(address) + "/failed";
}

void Node::grant() {
  if (leaving_) return;
  uint64_t epoch = ++epoch_;
  uint64_t sent_at = loop().now();
  client_.lease_grant(
      options_.ttl_s,
      [this, epoch, sent_at](core::Result<LeaseGrantResponse> r) {
        if (epoch != epoch_ || leaving_) return;
        if (!r) {
          grant_timer_.arm_after(options_.retry_ms);
          return;
        }
        lease_ = r->id;
        trusted_until_ = trust_end(sent_at, r->ttl);
        publish(r->id);
      },
      this);
}

uint64_t Node::trust_end(uint64_t sent_at, int64_t ttl_s) const {
  uint64_t ttl_ms = static_cast<uint64_t>(std::max<int64_t>(ttl_s, 0)) * 1000;
  return ttl_ms > options_.margin_ms ? sent_at + ttl_ms - options_.margin_ms : sent_at;
}

void Node::publish(int64_t lease) {
  uint64_t epoch = epoch_;
  PutRequest put{.key = node_key(options_.node), .value = options_.advertise, .lease = lease};
  client_.put(
      put,
      [this, epoch, lease](core::Result<PutResponse> r) {
        if (epoch != epoch_ || leaving_) return;
        if (!r || loop().now() >= trusted_until_) {
          // Without its node key the lease is of no use; a new one will be.
          client_.lease_revoke(
              lease, [](core::Result<LeaseRevokeResponse>) {}, this);
          lease_ = 0;
          grant_timer_.arm_after(options_.retry_ms);
          return;
        }
        published_ = true;
        trust_timer_.arm_at(trusted_until_);
        keepalive_timer_.arm_after(options_.keepalive_ms);
        events_.on_trust(true);
      },
      this);
}

void Node::send_keepalive() {
  if (!published_ || leaving_) return;
  uint64_t epoch = epoch_;
  uint64_t sent_at = loop().now();
  client_.lease_keepalive(
      lease_,
      [this, epoch, sent_at](core::Result<LeaseKeepAliveResponse> r) {
        if (epoch != epoch_ || leaving_ || !published_) return;
        if (!r) {
          // etcd unreachable or slow: try again soon; the trust timer decides when to give up.
          keepalive_timer_.arm_after(std::min(options_.retry_ms, options_.keepalive_ms));
          return;
        }
        if (r->ttl <= 0) return lose_trust("etcd says the lease is gone");
        extend(sent_at, r->ttl);
      },
      this);
  keepalive_timer_.arm_after(options_.keepalive_ms);
}

void Node::extend(uint64_t sent_at, int64_t ttl_s) {
  trusted_until_ = std::max(trusted_until_, trust_end(sent_at, ttl_s));
  // An answer that comes after its own trust ran out (the process was stopped, the loop stalled)
  // does not bring trust back: the lease may have expired in etcd meanwhile.
  if (loop().now() >= trusted_until_) return lose_trust("keep-alive answered too late");
  trust_timer_.arm_at(trusted_until_);
}

void Node::lose_trust(const char* /*why*/) {
  if (!published_) return;
  published_ = false;
  keepalive_timer_.cancel();
  trust_timer_.cancel();
  int64_t old = lease_;
  lease_ = 0;
  trusted_until_ = 0;
  // Best effort: if etcd is reachable the old lease's keys go now, else with its TTL.
  if (old != 0)
    client_.lease_revoke(
        old, [](core::Result<LeaseRevokeResponse>) {}, this);
  events_.on_trust(false);
  grant();
}

void Node::leave(std::function<void(core::Result<void>)> done) {
  leaving_ = true;
  bool was_trusted = published_;
  published_ = false;
  keepalive_timer_.cancel();
  trust_timer_.cancel();
  grant_timer_.cancel();
  int64_t old = std::exchange(lease_, 0);
  trusted_until_ = 0;
  if (was_trusted) events_.on_trust(false);
  if (old == 0) {
    loop().defer([done = std::move(done)] { done(core::Result<void>()); });
    return;
  }
  client_.lease_revoke(
      old,
      [done = std::move(done)](core::Result<LeaseRevokeResponse> r) {
        if (!r) return done(r.error());
        done(core::Result<void>());
      },
      this);
}

void Node::read_members() {
  RangeRequest range{.key = nodes_prefix(), .range_end = prefix_end(nodes_prefix())};
  client_.range(
      range,
      [this](core::Result<RangeResponse> r) {
        if (!r) {
          members_timer_.arm_after(options_.retry_ms);
          return;
        }
        std::string prefix = nodes_prefix();
        members_.clear();
        for (const auto& kv : r->kvs)
          members_[kv.key.substr(prefix.size())] = Member{kv.value, kv.lease};
        if (!members_handler_) members_handler_ = std::make_unique<MembersWatch>(*this);
        WatchRequest w{.key = prefix,
                       .range_end = prefix_end(prefix),
                       .start_revision = r->header.revision + 1};
        members_watch_ = client_.watch(std::move(w), *members_handler_);
        events_.on_members(members_);
      },
      this);
}

void Node::claim(std::string_view address, Client::Done<Claim> done) {
  if (!trusted()) {
    loop().defer([done = std::move(done)] {
      done(core::Error{kNoLease, "this node holds no trusted etcd lease"});
    });
    return;
  }
  std::string owner = owner_key(address);
  std::string failed = failed_key(address);
  TxnRequest txn;
  txn.compare.push_back(
      {.key = owner, .result = Compare::Result::kEqual, .target = Compare::Target::kCreate});
  txn.compare.push_back(
      {.key = failed, .result = Compare::Result::kEqual, .target = Compare::Target::kCreate});
  txn.success.emplace_back(PutRequest{.key = owner, .value = options_.node, .lease = lease_});
  txn.failure.emplace_back(RangeRequest{.key = owner});
  txn.failure.emplace_back(RangeRequest{.key = failed});
  uint64_t epoch = epoch_;
  int64_t lease = lease_;
  client_.txn(
      txn,
      [this, epoch, lease, done = std::move(done)](core::Result<TxnResponse> r) {
        if (!r) return done(r.error());
        Claim claim;
        if (r->succeeded) {
          // The key was created by this transaction: its create_revision is the transaction's.
          claim.owner = options_.node;
          claim.fence = r->header.revision;
          claim.mine = true;
        } else {
          for (size_t i = 0; i < r->responses.size(); ++i) {
            const auto* range = std::get_if<RangeResponse>(&r->responses[i]);
            if (!range || range->kvs.empty()) continue;
            const KeyValue& kv = range->kvs.front();
            if (i == 0) {
              claim.owner = kv.value;
              claim.fence = kv.create_revision;
              claim.mine = kv.value == options_.node && kv.lease == lease;
            } else {
              claim.failed = true;
              claim.failure = kv.value;
            }
          }
        }
        // Owned under a lease this node no longer trusts is not owned: it goes with that lease.
        if (claim.mine && (epoch != epoch_ || !trusted()))
          return done(
              core::Error{kNoLease, "the etcd lease stopped being trusted during the claim"});
        done(std::move(claim));
      },
      this);
}

void Node::release(std::string_view address, int64_t fence, Client::Done<bool> done) {
  std::string owner = owner_key(address);
  TxnRequest txn;
  txn.compare.push_back({.key = owner,
                         .result = Compare::Result::kEqual,
                         .target = Compare::Target::kCreate,
                         .number = fence});
  txn.success.emplace_back(DeleteRangeRequest{.key = owner});
  client_.txn(
      txn,
      [done = std::move(done)](core::Result<TxnResponse> r) {
        if (!r) return done(r.error());
        done(r->succeeded);
      },
      this);
}

void Node::mark_failed(std::string_view address, int64_t fence, std::string_view reason,
                       Client::Done<bool> done) {
  std::string owner = owner_key(address);
  nlohmann::json mark{{"node", options_.node}, {"reason", std::string(reason)}};
  TxnRequest txn;
  txn.compare.push_back({.key = owner,
                         .result = Compare::Result::kEqual,
                         .target = Compare::Target::kCreate,
                         .number = fence});
  txn.success.emplace_back(
      PutRequest{.key = failed_key(address),
                 .value = mark.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
  txn.success.emplace_back(DeleteRangeRequest{.key = owner});
  client_.txn(
      txn,
      [done = std::move(done)](core::Result<TxnResponse> r) {
        if (!r) return done(r.error());
        done(r->succeeded);
      },
      this);
}

void Node::clear_failed(std::string_view address, Client::Done<bool> done) {
  client_.delete_range(
      DeleteRangeRequest{.key = failed_key(address)},
      [done = std::move(done)](core::Result<DeleteRangeResponse> r) {
        if (!r) return done(r.error());
        done(r->deleted > 0);
      },
      this);
}

}  // namespace corral::cluster
