"""A crashed server process never stops the supervisor (issue 11, defect 2), and the supervisor's
exit status says why it stopped.

* `corral serve` as a new user runs it (the notes demo: one server process under a supervisor,
  the worker a child of the supervisor): `kill -9` of the server process. The supervisor re-forks
  it and keeps running, the worker keeps its pid, and the same note reaches the same worker.
  (It used to re-fork, then stop every worker and exit 0: the respawn was deferred where the
  "is anything left?" check could not see it.)
* `--processes 2`, both server processes killed in one batch (the supervisor stopped meanwhile,
  so it sees both deaths in one epoll round): both are respawned.
* A crash loop of the only server process (backoff) keeps the supervisor up.
* The supervisor stops by itself only when no server process is left to run: each exited 0 (here:
  someone sent each one SIGTERM) or 78 (a configuration it cannot run): its exit status is then
  1, resp. 78, never 0. SIGTERM of the supervisor still exits 0.
"""
import os
import re
import shutil
import signal
import tempfile
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_get, poll
from test_fanout import EX_CONFIG, Fanout, get

NOTES_WORKER = os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "corral-notes-worker")


def alive(srv):
    """The supervisor is still running (fails at once, with its log, if it is not)."""
    assert srv.proc.poll() is None, f"the supervisor exited {srv.proc.returncode}:\n" + \
        srv.log()[-3000:]
    return True


def wait_slot_replaced(fo, index, old_pid, timeout=10.0):
    def replaced():
        alive(fo.srv)
        s = {s["index"]: s for s in (fo.slots() or [])}.get(index)
        return s if s and s["status"] == "running" and s["pid"] not in (0, old_pid) else None
    return poll(replaced, timeout, what=f"slot {index} respawned", detail=fo.detail)


def process_age(pid):
    """Seconds since `pid` started (from /proc: its start time in clock ticks since boot)."""
    with open(f"/proc/{pid}/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def wait_stable(pid):
    """A death within 1 s (stable_ms) of a process's start is a crash loop (backoff); the case
    here is a plain crash, respawned at once: let the process be older than that first."""
    time.sleep(max(0.0, 1.2 - process_age(pid)))


def note_worker_pid(srv, note):
    """GET /note/<note>/ through the server process; the worker's pid its page shows."""
    status, body = get(srv, f"/note/{note}/", timeout=15.0)
    assert status == 200, body[:500]
    m = re.search(rb'pid\s*<span id="pid">(\d+)</span>', body)
    assert m, body[:500]
    return int(m.group(1))


@pytest.fixture
def state_dir():
    d = tempfile.mkdtemp(prefix="corral-sv-")  # short: a Unix socket path holds 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_kill9_of_the_only_server_process_keeps_supervisor_and_worker(server_factory, state_dir):
    if not os.access(NOTES_WORKER, os.X_OK):
        pytest.skip(f"{NOTES_WORKER} is not built")
    # What a new user runs: `corral serve`, the notes demo (one server process, a supervisor).
    srv = server_factory("--state-dir", state_dir, "--no-access-log", binary=CORRAL_BIN)
    fo = Fanout(srv, state_dir)
    slot = fo.wait_running()["processes"][0]
    worker = note_worker_pid(srv, "k1")
    assert control_get(state_dir, "/workers")["note:k1"]["pid"] == worker

    wait_stable(slot["pid"])
    os.kill(slot["pid"], signal.SIGKILL)
    new = wait_slot_replaced(fo, 0, slot["pid"])
    assert (new["last_exit"], new["restarts"]) == ("signal 9", 1), new

    # The same note reaches the same worker, through the new server process.
    assert note_worker_pid(srv, "k1") == worker
    entry = control_get(state_dir, "/workers")["note:k1"]
    assert (entry["pid"], entry["status"]) == (worker, "running"), entry
    assert alive(srv)
    log = srv.log()
    assert "workers_closing" not in log and "supervisor_stopped" not in log, log[-3000:]

    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(timeout=15) == 0, srv.log()[-3000:]


def test_both_server_processes_killed_at_once_are_respawned(server_factory, state_dir):
    srv = server_factory("--processes", "2", "--state-dir", state_dir, "--no-access-log",
                         binary=CORRAL_BIN)
    fo = Fanout(srv, state_dir)
    before = {s["index"]: s["pid"] for s in fo.wait_running()["processes"]}
    for pid in before.values():
        wait_stable(pid)
    # Stopped, the supervisor finds both pidfds readable in one epoll round when it goes on.
    srv.signal(signal.SIGSTOP)
    try:
        for pid in before.values():
            os.kill(pid, signal.SIGKILL)
        for pid in before.values():
            poll(lambda: not os.path.exists(f"/proc/{pid}/status")
                 or "zombie" in open(f"/proc/{pid}/status").read(), 5.0, what=f"{pid} dead")
    finally:
        srv.signal(signal.SIGCONT)
    for index, pid in before.items():
        wait_slot_replaced(fo, index, pid)
    assert get(srv, "/")[0] == 200 and alive(srv)
    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(timeout=10) == 0, srv.log()[-3000:]


def test_crash_loop_of_the_only_server_process_keeps_the_supervisor(server_factory, state_dir,
                                                                    no_core_dumps):
    # Workers configured (a kind whose program is never started): one process, a supervisor.
    config = '[workers.w]\ncommand = ["/bin/true"]\nroutes = ["/w/{id}/*"]\n'
    srv = server_factory("--state-dir", state_dir, "--no-access-log", binary=CORRAL_BIN,
                         config=config, env={"CORRAL_TEST_CRASH_AT_START": "0"})
    fo = Fanout(srv, state_dir)

    def backed_off(ms):
        alive(srv)
        s = (fo.slots() or [{}])[0]
        return s if s.get("status") == "backoff" and s.get("backoff_ms", 0) >= ms else None
    s = poll(lambda: backed_off(400), 10.0, what="slot 0 in backoff", detail=fo.detail)
    assert s["last_exit"] == "signal 6" and s["restarts"] >= 3, s
    assert alive(srv)
    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(timeout=5) == 0


def test_every_server_process_exiting_0_stops_the_supervisor_with_1(server_factory, state_dir):
    """Not a crash: each server process is sent SIGTERM and exits 0, which is not respawned.
    Nothing is left to serve, so the supervisor stops, and says it failed."""
    srv = server_factory("--processes", "2", "--state-dir", state_dir, "--no-access-log",
                         binary=CORRAL_BIN)
    fo = Fanout(srv, state_dir)
    for s in fo.wait_running()["processes"]:
        os.kill(s["pid"], signal.SIGTERM)
    assert srv.wait_exit(timeout=10) == 1, srv.log()[-3000:]
    assert re.search(r'error supervisor_failed reason="every server process exited by itself" '
                     r'exit=1', srv.log()), srv.log()[-3000:]


def test_server_processes_exiting_78_stop_the_supervisor_with_78(server_factory, state_dir):
    srv = server_factory("--processes", "2", "--state-dir", state_dir, "--no-access-log",
                         binary=CORRAL_BIN, env={"CORRAL_TEST_EXIT_AT_START": "78"})
    assert srv.wait_exit(timeout=10) == EX_CONFIG, srv.log()[-3000:]
    log = srv.log()
    assert len(re.findall(r"process_bad_config slot=\d exit=78", log)) == 2, log[-3000:]
    assert "supervisor_failed" in log and "supervisor_stopped generation=1 exit=78" in log
