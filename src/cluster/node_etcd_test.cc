// The etcd client and the Node against a real etcd (Debian's etcd-server, /usr/bin/etcd), started
// by each test on free loopback ports with a scratch data directory and killed at its end. Every
// wait is for an event (an answer, a watch event, a trust change), bounded by a deadline; no
// outcome depends on how fast the machine is. Lease TTLs are 2 s, etcd's smallest with its default
// election timeout, where a test waits for expiry or renewal, so that it stays short; 10 s
// elsewhere.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/node.h"
#include "core/event_loop.h"

namespace corral::cluster {
namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";
constexpr uint64_t kDeadlineMs = 15000;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// One etcd member on loopback; stop() and start() again keep its data (a restart).
class EtcdServer {
 public:
  EtcdServer() {
    char tmpl[] = "/tmp/corral-etcd-test.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    client_port_ = free_port();
    do peer_port_ = free_port();
    while (peer_port_ == client_port_);
  }
  ~EtcdServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void start() {
    std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {kEtcd,
                                     "--name=default",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=default=" + peer,
                                     "--log-level=error"};
    std::string log = dir_ + "/etcd.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kEtcd, argv.data());
      ::_exit(127);
    }
  }
  // SIGKILL: the harshest stop; etcd's WAL brings it back as it was.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }

 private:
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

// Runs the loop until `done` holds or the deadline passes; whether it held.
bool run_until(core::EventLoop& loop, const std::function<bool()>& done,
               uint64_t deadline_ms = kDeadlineMs) {
  uint64_t end = core::monotonic_ms() + deadline_ms;
  while (!done()) {
    if (core::monotonic_ms() >= end) return false;
    loop.run_once(50);
  }
  return true;
}

// Waits for an answer to one call made by `start`.
template <typename T>
std::optional<core::Result<T>> await(core::EventLoop& loop,
                                     const std::function<void(Client::Done<T>)>& start) {
  std::optional<core::Result<T>> out;
  start([&out](core::Result<T> r) { out.emplace(std::move(r)); });
  run_until(loop, [&out] { return out.has_value(); });
  return out;
}

struct NodeEvents final : Node::Events {
  void on_trust(bool t) override {
    trusted = t;
    if (t) {
      ++gained;
    } else {
      ++lost;
    }
  }
  void on_members(const std::map<std::string, Member>& m) override { members = m; }
  bool trusted = false;
  int gained = 0;
  int lost = 0;
  std::map<std::string, Member> members;
};

struct Recorder final : WatchHandler {
  void on_watch(const WatchResponse& r) override {
    if (r.created) ++created;
    for (const auto& e : r.events) events.push_back(e);
  }
  void on_compacted(int64_t) override { ++compacted; }
  void on_watch_broken(const core::Error&) override { ++broken; }
  int created = 0;
  int compacted = 0;
  int broken = 0;
  std::vector<WatchEvent> events;
};

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kEtcd, X_OK) != 0) GTEST_SKIP() << kEtcd << " is not installed (etcd-server)";
    etcd_.start();
    client_ = make_client();
    ASSERT_TRUE(wait_healthy(*client_)) << "etcd did not become healthy";
  }

  std::unique_ptr<Client> make_client() {
    ClientOptions o;
    o.endpoints = {etcd_.endpoint()};
    o.request_timeout_ms = 2000;
    auto c = Client::create(loop_, o);
    EXPECT_TRUE(c) << c.error().reason;
    return std::move(*c);
  }

  // /health answers true: asked again after each failure (etcd is still starting).
  bool wait_healthy(Client& client) {
    bool healthy = false;
    bool asking = false;
    core::Timer retry(loop_.timers(), [] {});
    return run_until(loop_, [&] {
      if (!healthy && !asking && !retry.armed()) {
        asking = true;
        client.health([&](core::Result<bool> r) {
          asking = false;
          healthy = r && *r;
          if (!healthy) retry.arm_after(50);
        });
      }
      return healthy;
    });
  }

  // `ttl_s`: 2 where a test waits for a lease to expire or renew (etcd's smallest), else 10, so
  // that a slow machine (a sanitized build, a loaded host) never costs a node its lease.
  NodeOptions node_options(const std::string& id, int64_t ttl_s = 10) {
    NodeOptions o;
    o.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    o.node = id;
    o.advertise = "127.0.0.1:" + std::to_string(9000 + id.size());
    o.ttl_s = ttl_s;
    o.retry_ms = 50;
    return o;
  }

  core::Result<Claim> claim(Node& node, const std::string& address) {
    auto r = await<Claim>(loop_, [&](Client::Done<Claim> d) { node.claim(address, d); });
    if (!r) return core::Error{ETIMEDOUT, "no answer"};
    return std::move(*r);
  }

  core::EventLoop loop_;
  EtcdServer etcd_;
  std::unique_ptr<Client> client_;
};

TEST_F(EtcdTest, KvTxnAndLeasesOverKeepAliveConnections) {
  auto put =
      await<PutResponse>(loop_, [&](auto d) { client_->put({.key = "k", .value = "v"}, d); });
  ASSERT_TRUE(put && *put) << (*put).error().reason;
  auto range = await<RangeResponse>(loop_, [&](auto d) { client_->range({.key = "k"}, d); });
  ASSERT_TRUE(range && *range);
  ASSERT_EQ((*range)->kvs.size(), 1u);
  EXPECT_EQ((*range)->kvs[0].value, "v");

  TxnRequest txn;
  txn.compare.push_back({.key = "k",
                         .result = Compare::Result::kEqual,
                         .target = Compare::Target::kValue,
                         .value = "other"});
  txn.success.emplace_back(PutRequest{.key = "k", .value = "x"});
  txn.failure.emplace_back(RangeRequest{.key = "k"});
  auto t = await<TxnResponse>(loop_, [&](auto d) { client_->txn(txn, d); });
  ASSERT_TRUE(t && *t);
  EXPECT_FALSE((*t)->succeeded);
  ASSERT_EQ((*t)->responses.size(), 1u);
  EXPECT_EQ(std::get<RangeResponse>((*t)->responses[0]).kvs.at(0).value, "v");

  auto grant = await<LeaseGrantResponse>(loop_, [&](auto d) { client_->lease_grant(5, d); });
  ASSERT_TRUE(grant && *grant);
  auto alive = await<LeaseKeepAliveResponse>(
      loop_, [&](auto d) { client_->lease_keepalive((*grant)->id, d); });
  ASSERT_TRUE(alive && *alive);
  EXPECT_EQ((*alive)->ttl, 5);
  auto revoke =
      await<LeaseRevokeResponse>(loop_, [&](auto d) { client_->lease_revoke((*grant)->id, d); });
  ASSERT_TRUE(revoke && *revoke);
  auto gone = await<LeaseKeepAliveResponse>(
      loop_, [&](auto d) { client_->lease_keepalive((*grant)->id, d); });
  ASSERT_TRUE(gone && *gone);
  EXPECT_EQ((*gone)->ttl, 0);
  // An etcd error comes back as one: a put under the revoked lease.
  auto bad = await<PutResponse>(
      loop_, [&](auto d) { client_->put({.key = "k", .value = "y", .lease = (*grant)->id}, d); });
  ASSERT_TRUE(bad);
  ASSERT_FALSE(*bad);
  EXPECT_EQ((*bad).error().code, kEtcdError + kGrpcNotFound);
  // One call at a time: every call went over the one keep-alive connection.
  EXPECT_EQ(client_->connections(), 1u);
}

TEST_F(EtcdTest, WatchSeesPutsAndDeletesInOrder) {
  Recorder rec;
  auto watch = client_->watch({.key = "w/", .range_end = prefix_end("w/")}, rec);
  ASSERT_TRUE(run_until(loop_, [&] { return rec.created > 0; }));
  bool done = false;
  client_->put({.key = "w/a", .value = "1"}, [&](auto) {
    client_->put({.key = "other", .value = "x"},
                 [&](auto) { client_->delete_range({.key = "w/a"}, [&](auto) { done = true; }); });
  });
  ASSERT_TRUE(run_until(loop_, [&] { return done && rec.events.size() >= 2; }));
  ASSERT_EQ(rec.events.size(), 2u);
  EXPECT_EQ(rec.events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(rec.events[0].kv.key, "w/a");
  EXPECT_EQ(rec.events[0].kv.value, "1");
  EXPECT_EQ(rec.events[1].type, WatchEvent::Type::kDelete);
  EXPECT_GT(rec.events[1].kv.mod_revision, rec.events[0].kv.mod_revision);
  EXPECT_EQ(rec.broken, 0);
}

TEST_F(EtcdTest, AHandlerMayDropItsWatchInsideItsCallback) {
  struct Dropper final : WatchHandler {
    void on_watch(const WatchResponse& r) override {
      if (!r.events.empty()) {
        ++events;
        watch.reset();
      }
    }
    void on_compacted(int64_t) override {}
    std::unique_ptr<Watch> watch;
    int events = 0;
  } dropper;
  dropper.watch = client_->watch({.key = "d/", .range_end = prefix_end("d/")}, dropper);
  ASSERT_TRUE(run_until(loop_, [&] { return dropper.watch->connected(); }));
  bool done = false;
  client_->put({.key = "d/a", .value = "1"}, [&](auto) {
    client_->put({.key = "d/b", .value = "2"}, [&](auto) { done = true; });
  });
  ASSERT_TRUE(run_until(loop_, [&] { return done && !dropper.watch; }));
  // One more round of the loop: nothing of the dropped watch runs.
  auto r = await<RangeResponse>(loop_, [&](auto d) { client_->range({.key = "d/a"}, d); });
  ASSERT_TRUE(r && *r);
  EXPECT_EQ(dropper.events, 1);
}

TEST_F(EtcdTest, CallsAndWatchesFailOverPastADeadEndpoint) {
  // A member that is gone (nothing listens there) first in the list.
  ClientOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(free_port()), etcd_.endpoint()};
  auto client = Client::create(loop_, o);
  ASSERT_TRUE(client);
  Recorder rec;
  auto watch = (*client)->watch({.key = "f/", .range_end = prefix_end("f/")}, rec);
  ASSERT_TRUE(run_until(loop_, [&] { return rec.created > 0; }));
  auto put =
      await<PutResponse>(loop_, [&](auto d) { (*client)->put({.key = "f/a", .value = "1"}, d); });
  ASSERT_TRUE(put && *put);
  ASSERT_TRUE(run_until(loop_, [&] { return rec.events.size() == 1; }));
  EXPECT_EQ((*client)->current_endpoint(), 1u);
}

TEST_F(EtcdTest, KeepAliveHoldsTheNodeKeyPastItsTtl) {
  NodeEvents ev;
  Node node(*client_, node_options("a", 2), ev);
  node.start();
  ASSERT_TRUE(run_until(loop_, [&] { return ev.trusted && ev.members.count("a"); }));
  uint64_t first = node.trusted_until();
  // Trust moved forward by more than two TTLs: the lease was renewed again and again.
  ASSERT_TRUE(run_until(loop_, [&] { return node.trusted_until() > first + 2 * 2000; }));
  EXPECT_EQ(ev.lost, 0);
  auto range =
      await<RangeResponse>(loop_, [&](auto d) { client_->range({.key = node.node_key("a")}, d); });
  ASSERT_TRUE(range && *range);
  ASSERT_EQ((*range)->kvs.size(), 1u);
  EXPECT_EQ((*range)->kvs[0].lease, node.lease());
  EXPECT_EQ((*range)->kvs[0].value, node.options().advertise);
}

TEST_F(EtcdTest, ClaimContentionHasExactlyOneOwner) {
  auto other = make_client();
  NodeEvents ea, eb;
  Node a(*client_, node_options("a"), ea);
  Node b(*other, node_options("b"), eb);
  a.start();
  b.start();
  ASSERT_TRUE(run_until(loop_, [&] { return ea.trusted && eb.trusted; }));
  std::optional<core::Result<Claim>> ra, rb;
  a.claim("doc", [&](core::Result<Claim> r) { ra.emplace(std::move(r)); });
  b.claim("doc", [&](core::Result<Claim> r) { rb.emplace(std::move(r)); });
  ASSERT_TRUE(run_until(loop_, [&] { return ra && rb; }));
  ASSERT_TRUE(*ra && *rb);
  const Claim& ca = ra->value();
  const Claim& cb = rb->value();
  EXPECT_NE(ca.mine, cb.mine);
  EXPECT_EQ(ca.owner, cb.owner);
  EXPECT_EQ(ca.fence, cb.fence);
  EXPECT_GT(ca.fence, 0);
  // Claiming again changes nothing: the owner is still the owner, with the same fence.
  auto again = claim(ca.mine ? a : b, "doc");
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->mine);
  EXPECT_EQ(again->fence, ca.fence);
}

TEST_F(EtcdTest, FencesIncreaseAcrossOwnersAndFailuresStick) {
  NodeEvents ea, eb;
  Node a(*client_, node_options("a"), ea);
  Node b(*client_, node_options("b"), eb);
  a.start();
  b.start();
  ASSERT_TRUE(run_until(loop_, [&] { return ea.trusted && eb.trusted; }));
  auto c1 = claim(a, "room");
  ASSERT_TRUE(c1 && c1->mine);
  auto rel = await<bool>(loop_, [&](auto d) { a.release("room", c1->fence, d); });
  ASSERT_TRUE(rel && *rel && **rel);
  auto c2 = claim(b, "room");
  ASSERT_TRUE(c2 && c2->mine);
  EXPECT_GT(c2->fence, c1->fence);
  // A stale owner's release does nothing.
  auto stale = await<bool>(loop_, [&](auto d) { a.release("room", c1->fence, d); });
  ASSERT_TRUE(stale && *stale);
  EXPECT_FALSE(**stale);
  // A failure mark sticks: nobody owns it, every claim says so, until it is cleared.
  auto mark = await<bool>(loop_, [&](auto d) { b.mark_failed("room", c2->fence, "crashed", d); });
  ASSERT_TRUE(mark && *mark && **mark);
  auto c3 = claim(a, "room");
  ASSERT_TRUE(c3);
  EXPECT_FALSE(c3->mine);
  EXPECT_TRUE(c3->failed);
  EXPECT_NE(c3->failure.find("crashed"), std::string::npos);
  auto cleared = await<bool>(loop_, [&](auto d) { a.clear_failed("room", d); });
  ASSERT_TRUE(cleared && *cleared && **cleared);
  auto c4 = claim(a, "room");
  ASSERT_TRUE(c4 && c4->mine);
  EXPECT_GT(c4->fence, c2->fence);
}

TEST_F(EtcdTest, ALeaseExpiryReleasesTheKeys) {
  NodeEvents ea, eb;
  auto a = std::make_unique<Node>(*client_, node_options("a", 2), ea);
  Node b(*client_, node_options("b"), eb);
  a->start();
  b.start();
  ASSERT_TRUE(run_until(loop_, [&] {
    return ea.trusted && eb.trusted && eb.members.count("a") && eb.members.count("b");
  }));
  auto c1 = claim(*a, "doc");
  ASSERT_TRUE(c1 && c1->mine);
  auto seen = claim(b, "doc");
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->owner, "a");
  // A crash: no more keep-alives, nothing revoked. Its lease expires, its keys go with it.
  a.reset();
  ASSERT_TRUE(run_until(loop_, [&] { return eb.members.count("a") == 0; }));
  auto c2 = claim(b, "doc");
  ASSERT_TRUE(c2 && c2->mine);
  EXPECT_GT(c2->fence, c1->fence);
  EXPECT_EQ(eb.lost, 0);
}

TEST_F(EtcdTest, RecoversWhenEtcdRestarts) {
  NodeEvents ev;
  Node node(*client_, node_options("a", 2), ev);
  node.start();
  Recorder rec;
  auto watch = client_->watch({.key = "r/", .range_end = prefix_end("r/")}, rec);
  ASSERT_TRUE(run_until(loop_, [&] { return ev.trusted && rec.created > 0; }));

  etcd_.stop();
  // Calls fail, the watch breaks, and the lease stops being trusted: the node says so.
  auto down =
      await<PutResponse>(loop_, [&](auto d) { client_->put({.key = "r/x", .value = "0"}, d); });
  ASSERT_TRUE(down);
  EXPECT_FALSE(*down);
  ASSERT_TRUE(run_until(loop_, [&] { return rec.broken > 0 && !ev.trusted && ev.lost == 1; }));
  auto refused = claim(node, "doc");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, kNoLease);

  etcd_.start();
  // Without restarting anything: the node gets a lease again, the watch resumes and sees a put
  // made after the restart, the same client's calls work.
  ASSERT_TRUE(run_until(loop_, [&] { return ev.trusted && ev.gained == 2; }));
  ASSERT_TRUE(run_until(loop_, [&] { return rec.created > 1; }));
  auto put =
      await<PutResponse>(loop_, [&](auto d) { client_->put({.key = "r/y", .value = "1"}, d); });
  ASSERT_TRUE(put && *put);
  ASSERT_TRUE(run_until(loop_, [&] { return !rec.events.empty(); }));
  EXPECT_EQ(rec.events.back().kv.key, "r/y");
  auto c = claim(node, "doc");
  ASSERT_TRUE(c && c->mine);
}

}  // namespace
}  // namespace corral::cluster
