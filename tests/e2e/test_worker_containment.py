"""Containment (issue 14, docs/process-model.md "Containment") on the real binary.

These machines' cgroup v2 tree offers no controllers, so the supervisor takes the rlimit way: the
test checks the one startup warning that says so, then a worker of a kind with memory_max that
allocates past it (tests/workers/contained_worker.py, mode hog: RLIMIT_AS makes an allocation fail,
the worker reports `fatal` with code memory_limit) leaves its address `failed` with the reason
"memory limit" in GET /workers and `corral ctl workers`. A worker flooding its stdout (mode flood:
tens of MiB, and a MiB-long line with no newline) makes its kind's log rotate (<kind>.log.1 ...,
each at most log_max_size plus one line, no more than log_keep of them) while the supervisor's RSS
stays bounded. (The cgroup way is unit-tested against a stand-in directory:
src/workers/containment_test.cc.)
"""
import glob
import http.client
import json
import os
import re

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_request, ctl, ctl_json, poll, rss_kib, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "workers", "contained_worker.py")
PYTHON = "/usr/bin/python3"
LOG_MAX = 1024 * 1024
LOG_KEEP = 3
FLOOD_MB = 40


def kind(name, env, extra=""):
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (f"[workers.{name}]\n"
            f"command = {json.dumps([PYTHON, '-S', WORKER])}\n"
            f"routes = [\"/{name}/{{id}}/*\"]\n"
            f"env = {{ {env_toml} }}\n" + extra)


@pytest.fixture
def corral(server_factory, tmp_path):
    state = tmp_path / "state"
    config = (kind("hog", {"CONTAINED_MODE": "hog"}, 'memory_max = "64M"\n') +
              kind("flood", {"CONTAINED_MODE": "flood", "CONTAINED_FLOOD_MB": str(FLOOD_MB)},
                   f"log_max_size = \"1M\"\nlog_keep = {LOG_KEEP}\n"))
    # ASan keeps freed blocks in a quarantine (256 MiB by default) before reuse: a small one lets
    # the RSS bound below say something about corral rather than about the sanitizer.
    env = {}
    if os.environ.get("CORRAL_SANITIZED"):
        env["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=8"
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config, env=env)
    wait_control_socket(str(state), 5, what="control socket")
    srv.state_dir = str(state)
    return srv


def get(srv, path, timeout=20):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def state(srv):
    status, body = control_request(srv.state_dir, "GET", "/workers")
    assert status == 200, body
    return json.loads(body)


def containment_mode(srv):
    return srv.wait_log(r"workers_containment mode=(\w+)").group(1)


def test_rlimit_fallback_is_one_warning_naming_the_limits(corral):
    if containment_mode(corral) == "cgroup":
        pytest.skip("this machine delegates a cgroup v2 group: no fallback to see")
    log = corral.wait_log(r"warn workers_containment mode=rlimits")
    text = corral.log()
    assert text.count("workers_containment") == 1, text
    line = next(l for l in text.splitlines() if "workers_containment" in l)
    assert "cgroup v2 not delegated here" in line, line
    assert "memory_max as RLIMIT_AS" in line, line
    # pids_max is RLIMIT_NPROC only for corral as root of the initial user namespace
    # (test_worker_descendants.py); otherwise it is not applied.
    with open("/proc/self/uid_map") as f:
        initial_root = os.getuid() == 0 and f.read().split() == ["0", "0", "4294967295"]
    assert ("pids_max as RLIMIT_NPROC" if initial_root else "pids_max not applied") in line, line
    assert "cpu_weight not applied" in line, line
    assert log


def test_memory_limited_worker_fails_with_its_reason(corral):
    status, body = get(corral, "/hog/1/")
    assert status in (502, 503), (status, body)  # it died with the request

    def failed():
        e = state(corral).get("hog:1")
        return e if e and e.get("status") == "failed" else None
    entry = poll(failed, 10, "hog:1 failed", detail=lambda: corral.log()[-3000:])
    assert entry["error"]["reason"] == "memory limit", entry
    assert entry["error"]["code"] == "memory_limit", entry
    workers = ctl_json(corral.state_dir, "workers")
    assert workers["hog:1"]["status"] == "failed"
    assert workers["hog:1"]["error"]["reason"] == "memory limit"
    if containment_mode(corral) == "rlimits":
        # It was the rlimit: the worker got well past Python's own size, then an allocation
        # failed below the 64 MiB limit. (In a cgroup the kernel's OOM kill ends it instead.)
        logs = os.path.join(corral.state_dir, "logs", "hog.log")
        m = poll(lambda: re.search(r"MemoryError after (\d+) MiB", open(logs).read()), 5,
                 "the worker's MemoryError line in hog.log")
        assert 16 <= int(m.group(1)) < 64, m.group(0)
    # Failed stays failed: the next request is a 503 with the same reason, and nothing forks.
    starts = corral.log().count("worker_starting ")
    status, body = get(corral, "/hog/1/")
    assert status == 503 and json.loads(body)["error"]["reason"] == "memory limit", body
    assert corral.log().count("worker_starting ") == starts
    assert ctl(corral.state_dir, "retry", "hog:1").returncode == 0


def test_flooding_worker_rotates_its_log_and_the_supervisor_stays_small(corral):
    pid = corral.proc.pid
    logs = os.path.join(corral.state_dir, "logs")
    # A first worker of another kind makes the supervisor's steady state (the manager, a pipe
    # reader, a log file) before the baseline is taken.
    assert get(corral, "/hog/warm/")[0] in (502, 503)
    poll(lambda: state(corral).get("hog:warm", {}).get("status") == "failed", 10, "warm-up")
    baseline = rss_kib(pid)
    status, body = get(corral, "/flood/1/")
    assert status == 200 and body == b"ok flood:1\n", (status, body)
    peak = baseline

    def done():
        nonlocal peak
        peak = max(peak, rss_kib(pid))
        try:
            with open(os.path.join(logs, "flood.log"), "rb") as f:
                return b"flood done" in f.read()
        except FileNotFoundError:
            return False
    poll(done, 120, "the flood's end in flood.log", interval=0.05)
    peak = max(peak, rss_kib(pid))
    files = sorted(glob.glob(os.path.join(logs, "flood.log*")))
    names = [os.path.basename(f) for f in files]
    assert names == ["flood.log"] + [f"flood.log.{i}" for i in range(1, LOG_KEEP + 1)], names
    # A line is at most the partial-line cut (16 KiB) and one read (16 KiB), log-escaped.
    longest_line = 64 * 1024
    for f in files:
        assert os.path.getsize(f) <= LOG_MAX + longest_line, (f, os.path.getsize(f))
    for f in files[1:]:  # the rotated ones are full
        assert os.path.getsize(f) > LOG_MAX // 2, (f, os.path.getsize(f))
    # The MiB-long line arrived cut into bounded pieces, each prefixed with the time and the address.
    with open(files[0], "rb") as f:
        tail = f.read().splitlines()
    assert all(re.match(rb"\d{4}-\d\d-\d\dT[\d:.]+Z flood:1 ", l) for l in tail), tail[:3]
    grown = peak - baseline
    print(f"supervisor RSS baseline {baseline} KiB, peak {peak} KiB")
    bound = 48 if os.environ.get("CORRAL_SANITIZED") else 16
    assert grown < bound * 1024, (
        f"the supervisor's RSS grew {grown // 1024} MiB over a {FLOOD_MB} MiB flood")
    # It still serves, and so does the worker.
    assert get(corral, "/flood/1/") == (200, b"ok flood:1\n")
