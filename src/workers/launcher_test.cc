// ProcessLauncher's in-process kind: the child runs a function of this program, without exec, with
// the same descriptors and environment a command gets (launcher.h). The child reports what it saw
// on its stdout and exits with a status of its choosing; the test waits on the pidfd (no sleeps).
#include "workers/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[512];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int wait_exit(const Launched& l) {
  pollfd p{l.pidfd.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 10'000), 1);
  int status = 0;
  EXPECT_EQ(waitpid(l.pid, &status, 0), l.pid);
  return status;
}

TEST(ProcessLauncher, InProcessKindRunsTheFunctionWithTheWorkerDescriptors) {
  int listen_sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, listen_sv), 0);
  LaunchSpec spec;
  spec.address = "room:7";
  spec.state_dir = "/state";
  spec.env = {{"ROOM_TEST", "yes"}};
  spec.listen_fd = listen_sv[0];
  spec.in_process = [] {
    // What worker::worker_main reads: the environment and fds 3 (SEQPACKET) and 4.
    int type = 0;
    socklen_t len = sizeof type;
    bool seqpacket = getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET;
    bool listen_ok = getsockopt(4, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
    bool closed = fcntl(5, F_GETFD) < 0;  // nothing of the parent's beyond fd 4
    printf("%s %s %s %s %s %d%d%d\n", getenv("CORRAL_ADDRESS"), getenv("CORRAL_STATE_DIR"),
           getenv("CORRAL_CONTROL_FD"), getenv("CORRAL_LISTEN_FD"), getenv("ROOM_TEST"), seqpacket,
           listen_ok, closed);
    return 7;
  };
  ProcessLauncher launcher;
  auto l = launcher.launch(spec);
  ASSERT_TRUE(l.ok()) << l.error().reason;
  ::close(listen_sv[0]);
  ::close(listen_sv[1]);
  // stdout is buffered by stdio (a pipe): the launcher flushes it before _exit.
  EXPECT_EQ(read_all(l->out.get()), "room:7 /state 3 4 yes 111\n");
  int status = wait_exit(l.value());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

TEST(ProcessLauncher, NeitherCommandNorFunctionIsAnError) {
  ProcessLauncher launcher;
  auto l = launcher.launch(LaunchSpec{});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().reason.find("no command"), std::string::npos);
}

}  // namespace
}  // namespace corral::workers
