#include "fanout/listen_claim.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace corral::fanout {

namespace {

socklen_t abstract_address(const std::string& full, sockaddr_un& sun) {
  sun = {};
  sun.sun_family = AF_UNIX;
  size_t n = std::min(full.size(), sizeof sun.sun_path - 1);
  std::memcpy(sun.sun_path + 1, full.data(), n);  // sun_path[0] = 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Whoever holds a claim's name.
struct Holder {
  enum class Kind {
    kNobody,   // not bound (any more)
    kKnown,    // `uid` (and `pid` if not 0) hold it
    kUnknown,  // bound, but its uid could not be read
  } kind = Kind::kUnknown;
  uid_t uid = 0;
  pid_t pid = 0;
};

// The uid of the stream socket bound to the abstract name in `sun`, in this network namespace,
// from the kernel's Unix socket diagnostics (UNIX_DIAG_UID, Linux 5.3). Reads every Unix socket
// of the namespace: called only when the name is bound and does not take a connection.
Holder bound_uid(const sockaddr_un& sun, socklen_t len) {
  Holder unknown;
  core::UniqueFd fd(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!fd) return unknown;
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } ask{};
  ask.header.nlmsg_len = sizeof ask;
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  ask.request.sdiag_family = AF_UNIX;
  ask.request.udiag_states = ~0u;  // listening or merely bound
  ask.request.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd.get(), &ask, sizeof ask, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) <
      0)
    return unknown;
  std::string_view wanted(sun.sun_path, len - offsetof(sockaddr_un, sun_path));
  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t got = ::recv(fd.get(), buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return unknown;
    size_t left = static_cast<size_t>(got);
    for (const char* p = buf; left >= sizeof(nlmsghdr);) {
      const auto* h = reinterpret_cast<const nlmsghdr*>(p);
      if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > left) return unknown;
      if (h->nlmsg_type == NLMSG_DONE) return Holder{Holder::Kind::kNobody};
      if (h->nlmsg_type == NLMSG_ERROR) return unknown;
      size_t step = std::min<size_t>(NLMSG_ALIGN(h->nlmsg_len), left);
      const size_t body = NLMSG_LENGTH(sizeof(unix_diag_msg));
      const auto* m = reinterpret_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= body &&
          m->udiag_type == SOCK_STREAM) {
        bool named = false;
        bool has_uid = false;
        uid_t uid = 0;
        size_t attrs = h->nlmsg_len - NLMSG_ALIGN(body);
        for (const char* a = p + NLMSG_ALIGN(body); attrs >= sizeof(rtattr);) {
          const auto* r = reinterpret_cast<const rtattr*>(a);
          if (r->rta_len < sizeof(rtattr) || r->rta_len > attrs) break;
          std::string_view value(a + RTA_LENGTH(0), r->rta_len - RTA_LENGTH(0));
          if (r->rta_type == UNIX_DIAG_NAME) named = value == wanted;
          if (r->rta_type == UNIX_DIAG_UID && value.size() >= sizeof uid) {
            std::memcpy(&uid, value.data(), sizeof uid);
            has_uid = true;
          }
          size_t next = std::min<size_t>(RTA_ALIGN(r->rta_len), attrs);
          a += next;
          attrs -= next;
        }
        if (named) return has_uid ? Holder{Holder::Kind::kKnown, uid, 0} : unknown;
      }
      p += step;
      left -= step;
    }
  }
}

// Who holds the name in `sun`: the pid and uid of whoever listens there (SO_PEERCRED); for a
// name that is bound but takes no connection (not listening, or its backlog full), the uid of
// its socket (bound_uid). Nobody if it refuses connections and the kernel lists no such socket.
Holder claim_holder(const sockaddr_un& sun, socklen_t len) {
  core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return {};
  // Non-blocking: a Unix stream connect completes at once, or fails with EAGAIN when the
  // owner's backlog is full, and never waits for the owner.
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&sun), len) < 0) {
    int error = errno;
    if (error != ECONNREFUSED && error != EAGAIN) return {};
    Holder h = bound_uid(sun, len);
    // No diagnostics: a refused connection says the owner is gone (or not listening yet).
    if (h.kind == Holder::Kind::kUnknown && error == ECONNREFUSED) h.kind = Holder::Kind::kNobody;
    return h;
  }
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0) return {};
  return Holder{Holder::Kind::kKnown, cred.uid, cred.pid > 0 ? cred.pid : 0};
}

}  // namespace

std::string claim_name(std::string_view proto, const core::SocketAddress& address) {
  return std::string(proto) + "-" + address.to_string();
}

core::Result<std::shared_ptr<ListenClaim>> claim_listen(std::string_view proto,
                                                        const core::SocketAddress& address) {
  std::string name = claim_name(proto, address);
  std::string where = "listen " + address.to_string() + " (" + std::string(proto) + ")";
  const uid_t me = ::geteuid();
  // The shared name first (a corral of another user that holds the port is named too), then this
  // user's own when another user holds the first.
  const std::string names[] = {"corral-listen-" + name,
                               "corral-listen-" + name + "-uid" + std::to_string(me)};
  std::optional<ForeignHolder> foreign;
  for (const std::string& full : names) {
    sockaddr_un sun;
    socklen_t len = abstract_address(full, sun);
    bool taken_by_other_user = false;
    // Twice at most: an owner that was exiting when our bind failed may be gone by the probe.
    for (int attempt = 0; attempt < 2 && !taken_by_other_user; ++attempt) {
      core::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!fd) return core::errno_error("socket(AF_UNIX)");
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sun), len) == 0) {
        if (::listen(fd.get(), 64) < 0) return core::errno_error("listen (claim)");
        return std::make_shared<ListenClaim>(std::move(name), std::move(fd), foreign);
      }
      if (errno != EADDRINUSE) return core::errno_error(("claim " + name).c_str());
      Holder owner = claim_holder(sun, len);
      if (owner.kind == Holder::Kind::kNobody) continue;
      if (owner.kind == Holder::Kind::kKnown && owner.uid != me) {
        if (!foreign) foreign = ForeignHolder{owner.uid, owner.pid};
        taken_by_other_user = true;
        continue;
      }
      std::string who = owner.pid > 0 ? "another corral (pid " + std::to_string(owner.pid) + ")"
                                      : "another corral";
      return core::Error{kErrorClaimed, where + " is held by " + who};
    }
    if (!taken_by_other_user)
      return core::Error{kErrorClaimed, where + ": its claim changed hands while it was taken"};
  }
  // Other users hold both names: nothing of ours can be there, and they must not keep us out.
  return std::make_shared<ListenClaim>(std::move(name), core::UniqueFd(), foreign);
}

void ListenClaim::report(core::Logger& log) {
  if (!foreign_ || reported_) return;
  reported_ = true;
  std::string pid = foreign_->pid > 0 ? std::to_string(foreign_->pid) : "unknown";
  log.warn("listen_claim_foreign", "claim={} holder_uid={} holder_pid={} exclusive={} note=\"{}\"",
           name_, foreign_->uid, pid, exclusive() ? "yes" : "no",
           exclusive() ? "another user holds the address's claim; claimed under this user's name"
                       : "other users hold both of the address's claims; serving without one, "
                         "so a second corral of this user on it would not be refused");
}

void report_claims(core::Logger& log, const std::vector<std::shared_ptr<ListenClaim>>& claims) {
  for (const auto& c : claims)
    if (c) c->report(log);
}

void ListenClaim::watch(core::EventLoop& loop) {
  if (loop_ || !fd_) return;
  if (loop.add(fd_.get(), EPOLLIN, this)) loop_ = &loop;
}

void ListenClaim::unwatch() {
  if (!loop_) return;
  loop_->remove(fd_.get());
  loop_ = nullptr;
}

void ListenClaim::on_io(uint32_t) {
  // Another instance's probe: it has read our pid already (SO_PEERCRED needs no data).
  for (int i = 0; i < 64; ++i) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    ::close(c);
  }
}

}  // namespace corral::fanout
