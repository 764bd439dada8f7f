"""What a worker starts does not outlive it, without cgroups (docs/process-model.md,
"Containment"), on the real binary:

  * a worker that daemonizes a grandchild (fork, setsid, fork: outside its process group and
    session; tests/workers/fake_worker.py with `daemon`) loses it at `corral ctl stop`: the
    grandchild is killed and reaped by the supervisor (the worker is a child subreaper, so its
    orphan stays below it; at its exit it comes to the supervisor, also a subreaper, which kills
    the children it did not start outside its own session);
  * pids_max under rlimits is RLIMIT_NPROC where that is one worker's count: with corral as root,
    a worker that switches to a uid of its own (tests/workers/contained_worker.py, mode forks)
    and forks 100 children sees the forks past pids_max = 32 refused with EAGAIN. (Root itself is
    exempt from RLIMIT_NPROC, and as another user corral does not apply it: the test is skipped
    there, after checking that the startup warning says so.)
"""
import errno
import http.client
import json
import os
import signal

import pytest

from conftest import CORRAL_BIN
from corral_test_util import alive, ceiling, ctl, ctl_json, poll, proc_stat, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")
CONTAINED = os.path.join(REPO, "tests", "workers", "contained_worker.py")
PYTHON = "/usr/bin/python3"
# A uid nothing else on the machine runs as: RLIMIT_NPROC counts every task of the uid.
WORKER_UID = 3_141_592


def kind(name, script, env, extra=""):
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (f"[workers.{name}]\n"
            f"command = {json.dumps([PYTHON, '-S', script])}\n"
            f"routes = [\"/{name}/{{id}}/*\"]\n"
            f"env = {{ {env_toml} }}\n" + extra)


def get(srv, path, timeout):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def serve(server_factory, tmp_path, config):
    state = tmp_path / "state"
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    wait_control_socket(str(state), ceiling(5), what="control socket")
    srv.state_dir = str(state)
    return srv


def test_a_stop_kills_what_the_worker_daemonized(server_factory, tmp_path):
    pid_file = str(tmp_path / "daemon.pid")
    srv = serve(server_factory, tmp_path, kind("d", FAKE, {
        "FAKE_WORKER_HTTP": "1", "FAKE_WORKER_START": json.dumps({"daemon": pid_file})}))
    assert get(srv, "/d/a/", ceiling(10)) == (200, b"hello d:a\n")
    worker = ctl_json(srv.state_dir, "workers")["d:a"]["pid"]
    daemon = poll(lambda: os.path.exists(pid_file) and int(open(pid_file).read()), ceiling(10),
                  what="the daemonized grandchild's pid")
    try:
        assert alive(daemon)
        assert os.getsid(daemon) != worker and os.getpgid(daemon) != worker
        assert ctl(srv.state_dir, "stop", "d:a").returncode == 0
        poll(lambda: "d:a" not in ctl_json(srv.state_dir, "workers"), ceiling(10),
             what="d:a stopped")
        # Killed, and reaped (no zombie left either).
        poll(lambda: proc_stat(daemon) is None, ceiling(10), what="the daemon gone",
             detail=lambda: f"{proc_stat(daemon)}\n{srv.log()[-3000:]}")
        assert "worker_orphans killed=" in srv.log()
    finally:
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_pids_max_is_rlimit_nproc_for_a_worker_on_its_own_uid(server_factory, tmp_path):
    srv = serve(server_factory, tmp_path, kind(
        "f", CONTAINED, {"CONTAINED_MODE": "forks", "CONTAINED_UID": str(WORKER_UID)},
        "pids_max = 32\n"))
    mode = srv.wait_log(r"workers_containment mode=(\w+)").group(1)
    line = next(l for l in srv.log().splitlines() if "workers_containment" in l)
    with open("/proc/self/uid_map") as f:
        initial_root = os.getuid() == 0 and f.read().split() == ["0", "0", "4294967295"]
    if mode == "rlimits" and not initial_root:
        assert "pids_max not applied" in line, line
        pytest.skip("corral does not run as root of the initial user namespace: pids_max is not "
                    "applied under rlimits (RLIMIT_NPROC would count all of corral's user)")
    if mode == "rlimits":
        assert "pids_max as RLIMIT_NPROC" in line, line
    status, body = get(srv, "/f/1/", ceiling(30))
    assert status == 200, (status, body)
    got = json.loads(body)
    if initial_root:
        assert got["uid"] == WORKER_UID, got
    # The worker's own tasks (its main thread and its control thread) count too.
    assert got["forked"] <= 32 and got["refused"] >= 100 - 32, got
    assert got["errno"] == errno.EAGAIN, got
    if mode == "rlimits":
        pid = ctl_json(srv.state_dir, "workers")["f:1"]["pid"]
        with open(f"/proc/{pid}/limits") as f:
            limits = f.read()
        assert any(l.startswith("Max processes") and l.split()[2:4] == ["32", "32"]
                   for l in limits.splitlines()), limits
