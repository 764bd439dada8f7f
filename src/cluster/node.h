// Node: this corral node's place in the cluster, kept in etcd. It holds a lease, keeps it alive,
// publishes itself under it, follows the other members, and claims addresses under that lease.
//
// The lease: granted with `ttl_s`, kept alive every keepalive_ms (ttl/3). It is *trusted* until
// the send time of the last keep-alive etcd answered (or of the grant) + the TTL etcd gave back
// - margin_ms, on the monotonic clock: etcd starts the TTL again when it handles the keep-alive,
// which is after we sent it, so the lease cannot expire in etcd before that point unless the
// clocks run at different rates (docs/cluster.md says what that assumes). Losing trust (that
// point passed; etcd said the lease is gone) ends the lease's epoch: on_trust(false), the old
// lease is revoked (best effort: it goes anyway when its TTL runs out), and a new lease is
// granted, again and again until etcd answers; then on_trust(true). Nothing owned under the old
// lease is owned any more.
//
// Keys, under the cluster's `name`:
//   <name>/nodes/<node>              = advertise address, under the lease (membership)
//   <name>/addresses/<addr>/owner    = owning node, under its lease (create_revision: the fence)
//   <name>/addresses/<addr>/failed   = {"node", "reason"} JSON, no lease (sticky until cleared)
//
// Lifetime: the Client outlives the Node; destroying the Node cancels its calls and revokes
// nothing (a crashed node's keys go with its lease; leave() revokes at once). Events are called
// from the loop, never inside a Node call; the Node must not be destroyed inside them.
// One thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "cluster/etcd_client.h"
#include "core/result.h"
#include "core/timer_wheel.h"

namespace corral::cluster {

// A claim or write needs a trusted lease, and this node has none now (the caller answers 503).
inline constexpr int kNoLease = 30001;

struct NodeOptions {
  std::string name = "corral";  // the cluster's key prefix
  std::string node;             // this node's id
  std::string advertise;        // where the other nodes reach this one
  int64_t ttl_s = 10;
  uint64_t keepalive_ms = 0;  // 0: ttl / 3
  uint64_t margin_ms = 0;     // 0: ttl / 5, at least 500 ms
  uint64_t retry_ms = 250;    // between attempts while etcd does not answer
};

struct Member {
  std::string advertise;
  int64_t lease = 0;
};

struct Claim {
  std::string owner;    // the owning node ("" when the address is failed and unowned)
  int64_t fence = 0;    // the owner key's create_revision
  bool mine = false;    // owned by this node under its current lease
  bool failed = false;  // a sticky failure mark stands (then nobody owns it)
  std::string failure;  // the mark's value
};

class Node {
 public:
  class Events {
   public:
    // The lease became trusted (the node key is published) or stopped being trusted.
    virtual void on_trust(bool trusted) = 0;
    // The member list changed (this node's own entry included).
    virtual void on_members(const std::map<std::string, Member>& /*members*/) {}

   protected:
    ~Events() = default;
  };

  Node(Client& client, NodeOptions options, Events& events);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Grants the first lease and starts following the members.
  void start();
  // Revokes the lease (this node's keys go at once) and stops; `done` when etcd answered.
  void leave(std::function<void(core::Result<void>)> done);

  bool trusted() const;
  uint64_t trusted_until() const { return trusted_until_; }  // monotonic ms; 0: never
  int64_t lease() const { return lease_; }
  const std::map<std::string, Member>& members() const { return members_; }
  const NodeOptions& options() const { return options_; }

  std::string node_key(std::string_view node) const;
  std::string nodes_prefix() const;
  std::string owner_key(std::string_view address) const;
  std::string failed_key(std::string_view address) const;

  // One transaction: if nobody owns `address` and no failure mark stands, this node owns it
  // under its lease (the fence: the new key's create_revision); otherwise what stands is read.
  // Fails with kNoLease without a trusted lease, before and after etcd answers.
  void claim(std::string_view address, Client::Done<Claim> done);
  // Deletes the owner key if it is still the one of `fence`; true when it was.
  void release(std::string_view address, int64_t fence, Client::Done<bool> done);
  // The owner of `fence` gives up the address and leaves a sticky mark (no lease: it outlives
  // this node) that makes every claim fail until clear_failed. True when it was still the owner.
  void mark_failed(std::string_view address, int64_t fence, std::string_view reason,
                   Client::Done<bool> done);
  void clear_failed(std::string_view address, Client::Done<bool> done);

 private:
  class MembersWatch;
  void grant();
  void publish(int64_t lease);
  // Until when a lease etcd renewed for ttl_s, as of a request sent at `sent_at`, is trusted.
  uint64_t trust_end(uint64_t sent_at, int64_t ttl_s) const;
  void send_keepalive();
  void extend(uint64_t sent_at, int64_t ttl_s);
  void lose_trust(const char* why);
  void read_members();
  core::EventLoop& loop() { return client_.loop(); }

  Client& client_;
  NodeOptions options_;
  Events& events_;
  bool started_ = false;
  bool leaving_ = false;
  uint64_t epoch_ = 0;  // one per lease: answers for an older lease are ignored
  int64_t lease_ = 0;
  bool published_ = false;
  uint64_t trusted_until_ = 0;
  core::Timer keepalive_timer_;
  core::Timer trust_timer_;
  core::Timer grant_timer_;
  core::Timer members_timer_;
  std::map<std::string, Member> members_;
  std::unique_ptr<MembersWatch> members_handler_;
  std::unique_ptr<Watch> members_watch_;
};

}  // namespace corral::cluster
