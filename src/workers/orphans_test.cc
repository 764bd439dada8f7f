// Orphans (orphans.h) against real processes: a child in a session of its own with a child of
// its own is killed with it and reaped; a child in this session, and one claimed as a worker, are
// left alone.
#include "workers/orphans.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <gtest/gtest.h>

namespace corral::workers {
namespace {

// A child that sleeps; `own_session`: it makes a session of its own and a child that sleeps too.
// Its pipe says when it is set up (and gives the grandchild's pid).
pid_t spawn(bool own_session, pid_t* grandchild) {
  int p[2];
  if (pipe(p) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    ::close(p[0]);
    pid_t g = 0;
    if (own_session) {
      setsid();
      g = fork();
      if (g == 0) {
        for (;;) pause();
      }
    }
    (void)!write(p[1], &g, sizeof g);
    for (;;) pause();
  }
  ::close(p[1]);
  pid_t g = 0;
  (void)!read(p[0], &g, sizeof g);
  ::close(p[0]);
  if (grandchild) *grandchild = g;
  return pid;
}

bool gone(pid_t pid) {
  auto st = proc_stat(pid);
  return !st || st->state == 'Z' || st->state == 'X';
}

TEST(Orphans, ChildrenOutsideTheSessionAreKilledWithTheirTreesAndReaped) {
  // As the supervisor is: a subreaper, so a killed orphan's children come here (not to init) when
  // it dies before its children were read, and a later sweep finds them.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
  pid_t g = 0;
  pid_t orphan = spawn(true, &g);
  pid_t same = spawn(false, nullptr);
  pid_t wg = 0;
  pid_t worker = spawn(true, &wg);
  ASSERT_GT(orphan, 0);
  ASSERT_GT(g, 0);
  auto kids = children_of(getpid());
  EXPECT_NE(std::find(kids.begin(), kids.end(), orphan), kids.end());
  EXPECT_EQ(proc_stat(g)->ppid, orphan);
  EXPECT_EQ(proc_stat(orphan)->session, orphan);

  // The first sweep kills the orphan and, unless it died first, its child; the supervisor sweeps
  // again every second, here at once until nothing is left.
  SweepResult total;
  for (int i = 0; i < 50; ++i) {
    SweepResult r = sweep_orphans(
        getsid(0), [&](pid_t p) { return p == worker; }, /*wait=*/true);
    total.killed += r.killed;
    total.reaped += r.reaped;
    EXPECT_EQ(r.left, 0u);
    if (r.killed == 0 && gone(g)) break;
    usleep(2'000);
  }
  EXPECT_GE(total.killed, 2u);  // the orphan and its child (and whatever an earlier test left)
  EXPECT_GE(total.reaped, 1u);
  EXPECT_FALSE(proc_stat(orphan).has_value());  // reaped
  EXPECT_TRUE(gone(g));
  EXPECT_FALSE(gone(same));    // in our session: not a worker's
  EXPECT_FALSE(gone(worker));  // a live worker
  // Nothing outlives the test, whatever failed above (a process left holding ctest's pipe would
  // hold the run until its timeout).
  for (pid_t p : {same, worker, wg, g}) {
    if (gone(p) && !proc_stat(p)) continue;
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0), 0);
}

}  // namespace
}  // namespace corral::workers
