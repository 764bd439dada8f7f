"""Worker bounds (issue 11 #5): a client that asks for many distinct addresses at once must not
be able to start a process per address. `[workers] max_workers` bounds the live worker processes,
`max_starting` the starts under way; over max_workers the longest-idle worker is stopped to make
room, and with none idle the request gets 503 with Retry-After and {"error":{"code":
"worker_limit"}}.

What is checked, on the real binary with the C++ example worker (the Python one without it):
  * with max_workers - max_starting workers kept busy (as a service's real users would), a burst
    of 300 distinct addresses from 32 keep-alive connections at once: the supervisor's children
    other than its server process (sampled from /proc throughout, forked or exec'd) never exceed
    max_workers; every request gets the worker's answer or a 503 with Retry-After and a public
    reason; the supervisor and the server process live on (same pids); a second client on its
    own connection gets every one of its requests answered meanwhile; nothing is left queued;
  * with every worker busy, a new address gets 503 `worker_limit` with Retry-After at once, a
    log line says why, and the address leaves no state entry.

Before the bounds, the configuration was refused ([workers] held only kinds) and the same burst
with no bound started a process for every address.
"""
import concurrent.futures
import http.client
import json
import os
import re
import subprocess
import threading

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, children_of, poll, wait_control_socket
from test_workers import CPP_WORKER, WORKERS, Corral, toml_str

MAX_WORKERS = 6
MAX_STARTING = 2
ADDRESSES = 300
CONNECTIONS = 32


def child_pids(pid):
    """Every child of `pid` (forked by any of its threads), from /proc."""
    out = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return out


def children(c):
    """(worker pids, other child pids) of the supervisor, from /proc."""
    workers, others = set(), set()
    for pid, cmd in children_of(c.srv.proc.pid).items():
        (workers if c.marker.encode() in cmd else others).add(pid)
    return workers, others


@pytest.fixture
def bounded(server_factory, tmp_path):
    kind = "cpp" if os.access(CPP_WORKER, os.X_OK) else "py"
    argv, marker = WORKERS[kind]
    state = tmp_path / "state"
    config = "\n".join([
        "[workers]",
        f"max_workers = {MAX_WORKERS}",
        f"max_starting = {MAX_STARTING}",
        "[workers.counter]",
        f"command = [{', '.join(toml_str(a) for a in argv)}]",
        'routes = ["/counter/{id}/*"]',
        'idle = "5m"',
    ]) + "\n"
    srv = server_factory("--state-dir", str(state), "--no-access-log", binary=CORRAL_BIN,
                         config=config)
    c = Corral(srv, str(state), marker)
    wait_control_socket(c.state_dir, 5, what="control socket")
    return c


def check_refusal(status, headers, body):
    assert status == 503, (status, body)
    assert int(headers.get("retry-after", "0")) > 0, headers
    err = json.loads(body)["error"]
    assert err["code"] in ("worker_limit", "start_limit"), err
    assert isinstance(err["message"], str) and err["message"], err
    return err["code"]


def test_a_burst_of_addresses_stays_within_the_bounds(bounded):
    c = bounded
    assert c.get("/")[0] == 200
    _, servers = children(c)
    assert len(servers) == 1, servers
    sup_pid = c.srv.proc.pid

    most = [0]
    stop = threading.Event()

    # Busy workers: their places cannot be taken. The burst has max_starting places to share.
    busy = MAX_WORKERS - MAX_STARTING
    for i in range(busy):
        status, _, body = c.get(f"/counter/busy{i}/busy?ms=60000")
        assert status == 200, (i, status, body)

    def sample():
        while not stop.is_set():  # every child but the server process: workers, forked or not
            most[0] = max(most[0], len(child_pids(sup_pid) - servers))
            stop.wait(0.001)

    second = {"ok": 0, "bad": []}

    def second_client():
        conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=30)
        try:
            while not stop.is_set():
                conn.request("GET", "/")
                r = conn.getresponse()
                r.read()
                if r.status == 200:
                    second["ok"] += 1
                else:
                    second["bad"].append(r.status)
                stop.wait(0.01)
        except Exception as e:  # noqa: BLE001 - any failure of the second client is the finding
            second["bad"].append(repr(e))
        finally:
            conn.close()

    def burst(k):
        """One keep-alive connection asking for its share of the addresses."""
        out = []
        conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=60)
        try:
            for i in range(k, ADDRESSES, CONNECTIONS):
                conn.request("GET", f"/counter/b{i}/")
                r = conn.getresponse()
                out.append((i, r.status, {h.lower(): v for h, v in r.getheaders()}, r.read()))
        finally:
            conn.close()
        return out

    sampler = threading.Thread(target=sample)
    other = threading.Thread(target=second_client)
    sampler.start()
    other.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(CONNECTIONS) as ex:
            results = [r for part in ex.map(burst, range(CONNECTIONS)) for r in part]
    finally:
        stop.set()
        sampler.join()
        other.join()

    assert len(results) == ADDRESSES
    answered, refused = 0, {}
    for i, status, headers, body in results:
        if status == 200:
            assert body == b"0\n", (i, body)
            answered += 1
        else:
            code = check_refusal(status, headers, body)
            refused[code] = refused.get(code, 0) + 1
    assert answered >= MAX_STARTING, (answered, refused)  # those had a free place
    assert refused.get("worker_limit", 0) > 0, (answered, refused)
    assert most[0] <= MAX_WORKERS, (most[0], c.srv.log()[-3000:])
    assert not second["bad"], second
    assert second["ok"] > 0
    # The supervisor and its server process survived; nothing is queued, nothing failed.
    assert c.srv.proc.poll() is None
    assert children(c)[1] == servers
    assert c.srv.proc.pid == sup_pid
    st = c.state()
    assert len(st) <= MAX_WORKERS, st
    assert all(e["status"] in ("running", "stopping", "starting") for e in st.values()), st
    log = c.srv.log()
    assert "worker_failed" not in log, log[-3000:]
    assert "worker_limit" in log
    assert f"workers_bounds max_starting={MAX_STARTING} max_workers={MAX_WORKERS}" in log


def test_with_every_worker_busy_a_new_address_gets_503_with_retry_after(bounded):
    c = bounded
    for i in range(MAX_WORKERS):
        status, _, body = c.get(f"/counter/busy{i}/busy?ms=20000")
        assert status == 200, (i, status, body)
    poll(lambda: len(c.state()) == MAX_WORKERS, 5, what="every worker running")
    assert len(children(c)[0]) == MAX_WORKERS
    status, headers, body = c.get("/counter/new/")
    assert check_refusal(status, headers, body) == "worker_limit"
    assert "counter:new" not in c.state()
    assert len(children(c)[0]) == MAX_WORKERS
    c.srv.wait_log(r'worker_limit address="counter:new" live=6 max_workers=6')
    # A worker that is stopped frees its place: the same address is then served.
    r = c.ctl("stop", "counter:busy0")
    assert r.returncode == 0, r.stderr
    c.wait_gone("counter:busy0", timeout=10)
    status, _, body = c.get("/counter/new/")
    assert (status, body) == (200, b"0\n")
    # Once counter:new is idle (it says so 100 ms after its request), it is the one worker that
    # may be stopped: a new address takes its place.
    def served():
        status, headers, body = c.get("/counter/new2/")
        if status == 503:
            check_refusal(status, headers, body)
            return False
        assert (status, body) == (200, b"0\n")
        return True

    poll(served, 10, interval=0.05, what="counter:new2 served")
    c.srv.wait_log(r'worker_evicted address="counter:new" pid=\d+ idle_ms=\d+ for="counter:new2"')
    assert "counter:new" not in c.state()
    assert len(children(c)[0]) <= MAX_WORKERS


def test_check_validates_the_bounds(tmp_path):
    argv, _ = WORKERS["py"]
    kind = "\n".join([f"command = [{', '.join(toml_str(a) for a in argv)}]",
                      'routes = ["/counter/{id}/*"]'])

    def check(text):
        path = tmp_path / "corral.toml"
        path.write_text(text + "\n")
        return subprocess.run([CORRAL_BIN, "check", "--config", str(path)], capture_output=True,
                              text=True, timeout=ceiling(10))

    r = check(f"[workers]\nmax_workers = 0\nmax_starting = \"many\"\n"
              f"[workers.counter]\n{kind}\nmax_workers = 2000000")
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert re.search(r"workers\.max_workers: 0 is out of range \(1\.\.", r.stderr), r.stderr
    assert "workers.max_starting: expected an integer" in r.stderr, r.stderr
    assert re.search(r"workers\.counter\.max_workers: 2000000 is out of range", r.stderr), r.stderr
    r = check(f"[workers.max_workers]\n{kind}")
    assert r.returncode == 78, (r.stdout, r.stderr)
    assert "workers.max_workers: a worker kind may not have this name" in r.stderr, r.stderr
    r = check(f"[workers]\nmax_workers = 100\nmax_starting = 4\n[workers.counter]\n{kind}\n"
              "max_workers = 10")
    assert r.returncode == 0, (r.stdout, r.stderr)
