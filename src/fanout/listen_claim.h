// Listen claims: one corral per listen address in a network namespace.
//
// The supervisor's listening sockets are SO_REUSEPORT groups (one socket per slot), so a second
// corral of the same user on the same address would simply join the group: the kernel would
// split the connections between the two, and each would run its own worker for one address with
// its own state. To refuse that, the supervisor claims every address it listens on before it
// binds it: it binds an abstract Unix socket named after the address,
// "\0corral-listen-tcp-127.0.0.1:8080" (QUIC: "...-udp-..."). Abstract names live in the network
// namespace, like ports, and vanish with their last descriptor, so a crashed or SIGKILLed
// supervisor leaves nothing behind. A second claim fails with EADDRINUSE; the loser connects to
// the name and reads the owner's pid and uid with SO_PEERCRED (the credentials of whoever called
// listen()), or, when the name is bound but does not accept connections, the socket's uid from
// the kernel's socket diagnostics (sock_diag). Held by the same user, the loser refuses to start
// naming the address and that pid (kErrorClaimed).
//
// Any local user can bind any abstract name, so a name held by another user is no corral of
// ours (SO_REUSEPORT only groups sockets of one uid: another user's corral could not share the
// port anyway). It must not stop us: the claim then takes a second name of its own user,
// "...-tcp-127.0.0.1:8080-uid1000", which two corrals of that user still use to refuse each
// other; if another user holds that one too, the claim is not exclusive (it holds nothing) and
// the server runs anyway. Either way the claim records the other user (foreign()) and
// report() logs it once.
//
// A port 0 is claimed after the bind, by the port the kernel chose (the bind itself made it
// exclusive until then). The claim listens so that probes can connect; watch() accepts and
// closes them on the owner's loop, or failed starts would pile up in its backlog.
//
// Lifetime: shared by whatever serves the address (every ListenerSet that has it, so a reload
// that keeps an address keeps its claim, and an old generation draining on an address the new
// configuration dropped keeps it until its last process is gone; the QUIC sockets hold theirs for
// the supervisor's life). The descriptor is close-on-exec and closed in forked children.
// Single-threaded.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/event_loop.h"
#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"
#include "core/unique_fd.h"

namespace corral::fanout {

// core::Error::code of a claim held by another process (its reason names the address and pid).
constexpr int kErrorClaimed = 0x10000 + 98;

// A process of another user that holds a claim's name.
struct ForeignHolder {
  uid_t uid = 0;
  pid_t pid = 0;  // 0: not known (the name is bound but does not accept connections)
};

class ListenClaim final : public core::IoHandler {
 public:
  ListenClaim(std::string name, core::UniqueFd fd, std::optional<ForeignHolder> foreign = {})
      : name_(std::move(name)), fd_(std::move(fd)), foreign_(foreign) {}
  ListenClaim(const ListenClaim&) = delete;
  ListenClaim& operator=(const ListenClaim&) = delete;
  ~ListenClaim() { unwatch(); }

  const std::string& name() const { return name_; }  // "tcp-127.0.0.1:8080"
  // False when other users hold both of the address's names: nothing refuses a second corral.
  bool exclusive() const { return static_cast<bool>(fd_); }
  // Another user's process on the address's first name, if one was there.
  const std::optional<ForeignHolder>& foreign() const { return foreign_; }
  // Logs `listen_claim_foreign` (a warning) once when another user held a name.
  void report(core::Logger& log);
  // Accept (and close at once) the probes of other instances on `loop`; idempotent. unwatch()
  // before the loop is destroyed.
  void watch(core::EventLoop& loop);
  void unwatch();
  void on_io(uint32_t events) override;

 private:
  std::string name_;
  core::UniqueFd fd_;
  std::optional<ForeignHolder> foreign_;
  bool reported_ = false;
  core::EventLoop* loop_ = nullptr;
};

// report() for each of `claims`.
void report_claims(core::Logger& log, const std::vector<std::shared_ptr<ListenClaim>>& claims);

// The claim's name for `proto` ("tcp" or "udp") and `address` ("tcp-[::1]:8443").
std::string claim_name(std::string_view proto, const core::SocketAddress& address);

// Claims `address` (its port must not be 0). Fails with kErrorClaimed ("listen 127.0.0.1:8080 is
// held by another corral (pid 1234)") when a process of this user holds it, or with the errno
// of a socket call; a name held by another user does not fail it (see above).
core::Result<std::shared_ptr<ListenClaim>> claim_listen(std::string_view proto,
                                                        const core::SocketAddress& address);

}  // namespace corral::fanout
