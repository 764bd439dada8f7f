"""Workers (issue 4, docs/worker-protocol.md): one process per address, started on demand by the
supervisor's worker manager, proxied to from the server processes, stopped when idle, and failures
that stay failed until `retry`. Driven from outside on the real binary (`corral serve` with
`[workers.counter]`) and the example workers (Python, standard library only; C++ with
worker_main; Node.js on lib/node, CORRAL_NODE or `node`), which serve the same counter:

    GET / (the count), POST /inc, GET /start, GET /busy?ms=N, GET /slow?ms=N, GET /crash,
    GET /fatal

What is checked:
  * start on the first request (the answer is the worker's; `ctl workers` shows it running with
    the pid of a live child of the supervisor), state kept across requests, the path the worker
    sees (the route's `*` part plus the query);
  * idle stop (the entry goes, the process goes; the next request forks a new pid, which reads
    what the closer of the old one saved); /busy, a request in flight (/slow) and an open
    WebSocket (the C++ worker's /echo) keeping a worker past `idle`;
  * a crash, a kill -9 and a `fatal`: the address stays failed (503 JSON {error:{message}} and no
    new fork) until `ctl retry`; a fatal's secret ("secret-123") reaches neither a client, nor
    `ctl workers`, nor GET /workers, nor the watch stream, but the supervisor's log has it
    (`worker_failed`);
  * suspend / resume / stop; 50 addresses at once, all answered and all idle-stopped, nothing left;
  * the per-address flock (held by the worker, released by kill -9);
  * SIGTERM of the supervisor: every worker exits, the supervisor exits 0, no failure is logged;
  * the control API's watch stream (ndjson over the Unix socket) showing a start and a stop;
  * the access log line of a proxied request.

Worker PIDs come from the manager's state (the control socket, as `corral ctl workers` asks) and
are cross-checked against /proc (children of the supervisor running the worker's program). Every
wait polls an observable (state, /proc, the log) with a deadline; the only fixed pauses are the
windows in which something that must not happen (a fork, an idle stop) would have happened.
"""
import concurrent.futures
import fcntl
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import (alive, children_of, control_request, ctl, ctl_json, poll,
                              wait_control_socket)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
SECRET = "secret-123"
REDACTED = "the counter failed"

WORKERS = {
    "py": ([sys.executable if sys.executable else "/usr/bin/python3", PY_WORKER], "worker.py"),
    "cpp": ([CPP_WORKER], "example_worker"),
    "node": ([os.environ.get("CORRAL_NODE", "node"),
              os.path.join(REPO, "examples", "worker_node", "worker.mjs")], "worker_node"),
}


# --- helpers ------------------------------------------------------------------------------------


def toml_str(s):
    return json.dumps(s)


class Corral:
    """A running `corral serve` with one worker kind `counter` on "/counter/{id}/*"."""

    def __init__(self, srv, state_dir, marker):
        self.srv = srv
        self.state_dir = state_dir
        self.marker = marker  # a substring of the worker's cmdline

    # HTTP to the server
    def request(self, method, path, body=None, headers=None, timeout=10):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    # the control socket
    def control(self, method, path, timeout=5):
        return control_request(self.state_dir, method, path, timeout)

    def state(self):
        status, body = self.control("GET", "/workers")
        assert status == 200, body
        return json.loads(body)

    def ctl(self, *args):
        return ctl(self.state_dir, *args)

    def ctl_workers(self):
        return ctl_json(self.state_dir, "workers")

    # processes
    def worker_pids(self):
        """Live children of the supervisor running the worker program (from /proc)."""
        marker = self.marker.encode()
        return {p for p, cmd in children_of(self.srv.proc.pid).items() if marker in cmd}

    def starts(self):
        return self.srv.log().count("worker_starting ")

    def wait_status(self, address, status, timeout=5):
        def check():
            e = self.state().get(address)
            return e if e and e.get("status") == status else None
        return poll(check, timeout, what=f"{address} {status}",
                    detail=lambda: f"state={self.state()}\nlog:\n{self.srv.log()[-3000:]}")

    def wait_gone(self, address, timeout=5):
        poll(lambda: address not in self.state(), timeout, what=f"{address} has no entry",
             detail=lambda: f"state={self.state()}\nlog:\n{self.srv.log()[-3000:]}")

    def running_pid(self, address):
        e = self.wait_status(address, "running")
        return e["pid"]


@pytest.fixture(params=["py", "cpp", "node"])
def worker_kind(request):
    if request.param == "cpp" and not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    return request.param


@pytest.fixture
def corral(server_factory, tmp_path):
    """corral(kind="py"|"cpp", idle=None, extra="") -> a running Corral."""

    def make(kind="py", idle=None, stop_grace=None, extra=""):
        argv, marker = WORKERS[kind]
        state = tmp_path / "state"
        lines = ["[workers.counter]",
                 f"command = [{', '.join(toml_str(a) for a in argv)}]",
                 'routes = ["/counter/{id}/*"]']
        if idle is not None:
            lines.append(f"idle = {toml_str(idle)}")
        if stop_grace is not None:
            lines.append(f"stop_grace = {toml_str(stop_grace)}")
        config = extra + "\n" + "\n".join(lines) + "\n"
        srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
        c = Corral(srv, str(state), marker)
        wait_control_socket(c.state_dir, 5, what="control socket")
        return c

    return make


def assert_json_error(status, headers, body, expected_status=503):
    assert status == expected_status, (status, body)
    assert headers.get("content-type", "").startswith("application/json"), headers
    err = json.loads(body)["error"]
    assert isinstance(err.get("message"), str) and err["message"], err
    return err


# --- tests --------------------------------------------------------------------------------------


def test_start_on_first_request_and_state_kept(corral, worker_kind):
    c = corral(worker_kind)
    assert c.state() == {}
    assert c.worker_pids() == set()
    status, _, body = c.get("/counter/a/")
    assert (status, body) == (200, b"0\n")  # the worker's answer
    workers = c.ctl_workers()
    entry = workers["counter:a"]
    assert entry["status"] == "running", workers
    assert isinstance(entry["startedAt"], str) and entry["startedAt"]
    pid = entry["pid"]
    assert c.worker_pids() == {pid}
    assert os.getpgid(pid) == pid  # its own process group
    # state kept across requests, one worker
    assert c.request("POST", "/counter/a/inc")[2] == b"1\n"
    assert c.request("POST", "/counter/a/inc")[2] == b"2\n"
    assert c.get("/counter/a/")[2] == b"2\n"
    # another address: another process, its own state
    assert c.get("/counter/b/")[2] == b"0\n"
    pid_b = c.running_pid("counter:b")
    assert pid_b != pid and c.worker_pids() == {pid, pid_b}
    assert c.get("/counter/a/")[2] == b"2\n"
    # the worker sees its address and the start message
    status, _, body = c.get("/counter/a/start")
    assert status == 200
    assert json.loads(body)["address"] == "counter:a"
    # the path the worker sees is the '*' part plus the query
    status, _, body = c.get("/counter/a/busy?ms=1")
    assert (status, body) == (200, b"busy 1 ms\n")
    assert c.get("/counter/a/nope")[0] == 404
    assert c.starts() == 2
    assert c.state()["counter:a"]["pid"] == pid


def test_idle_stop_then_new_worker(corral, worker_kind):
    c = corral(worker_kind, idle="1s")
    assert c.request("POST", "/counter/i/inc")[2] == b"1\n"
    pid = c.running_pid("counter:i")
    t0 = time.monotonic()
    c.wait_gone("counter:i", timeout=4)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.5, f"stopped after {elapsed:.2f}s, before idle (1 s)"
    poll(lambda: not alive(pid), 3, what="the idle worker's exit")
    assert "counter:i" not in c.ctl_workers()
    assert c.worker_pids() == set()
    # the next request starts a new worker, which reads what the old one's closer saved
    status, _, body = c.get("/counter/i/")
    assert (status, body) == (200, b"1\n")
    pid2 = c.running_pid("counter:i")
    assert pid2 != pid and alive(pid2)
    assert c.starts() == 2
    assert "worker_failed" not in c.srv.log()


def test_busy_keeps_worker_past_idle(corral, worker_kind):
    c = corral(worker_kind, idle="1s")
    status, _, body = c.get("/counter/busy/busy?ms=2500")
    assert (status, body) == (200, b"busy 2500 ms\n")
    t0 = time.monotonic()
    pid = c.running_pid("counter:busy")
    # an idle worker would be gone by now (idle 1 s, checked every second)
    time.sleep(2.2 - (time.monotonic() - t0))
    e = c.state().get("counter:busy")
    assert e and e["status"] == "running" and e["pid"] == pid, e
    assert alive(pid)
    # once the busy hold ends (2.5 s) it is stopped after idle
    c.wait_gone("counter:busy", timeout=4)
    assert time.monotonic() - t0 >= 3.0
    poll(lambda: not alive(pid), 3, what="the worker's exit")


def test_request_in_flight_keeps_worker_past_idle(corral, worker_kind):
    """A request in flight longer than `idle` (2.5 s against 1 s, checked every second): the
    worker reports itself not idle meanwhile, so no idle stop begins before the answer."""
    c = corral(worker_kind, idle="1s")
    assert c.get("/counter/slow/")[0] == 200
    pid = c.running_pid("counter:slow")
    status, _, body = c.get("/counter/slow/slow?ms=2500")
    assert (status, body) == (200, b"slow 2500 ms\n")
    # an idle stop during the request would have logged worker_stopping (reason=idle) by now
    assert 'worker_stopping address="counter:slow"' not in c.srv.log(), c.srv.log()[-3000:]
    assert c.state()["counter:slow"]["pid"] == pid and alive(pid)
    # once it has answered, it is idle and is stopped after `idle`
    c.wait_gone("counter:slow", timeout=5)
    poll(lambda: not alive(pid), 3, what="the worker's exit")
    assert c.starts() == 1


def test_crash_stays_failed_until_retry(corral, worker_kind):
    c = corral(worker_kind)
    c.request("POST", "/counter/c/inc")
    pid = c.running_pid("counter:c")
    status, _, _ = c.get("/counter/c/crash")
    assert status >= 500  # the request that crashed it has no answer from the worker
    entry = c.wait_status("counter:c", "failed")
    assert "pid" not in entry and isinstance(entry["at"], str)
    assert entry["error"]["message"]
    poll(lambda: not alive(pid), 3, what="the crashed worker gone")
    starts = c.starts()
    for _ in range(3):
        status, headers, body = c.get("/counter/c/")
        err = assert_json_error(status, headers, body)
        assert err == entry["error"]
    time.sleep(0.3)  # a fork would show by now
    assert c.starts() == starts
    assert c.worker_pids() == set()
    assert c.ctl_workers()["counter:c"]["status"] == "failed"
    assert "worker_failed" in c.srv.log()
    # other addresses are not affected
    assert c.get("/counter/other/")[0] == 200
    # retry clears it; the next request starts a worker
    r = c.ctl("retry", "counter:c")
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.state().get("counter:c", {}).get("status") != "failed"
    status, _, body = c.get("/counter/c/")
    assert status == 200 and body in (b"0\n", b"1\n")  # a crash skips the closer
    pid2 = c.running_pid("counter:c")
    assert pid2 != pid and alive(pid2)
    # retry of an address that is not failed: 404, exit 1
    r = c.ctl("retry", "counter:c")
    assert r.returncode == 1


def test_kill9_is_a_crash(corral, worker_kind):
    c = corral(worker_kind)
    assert c.get("/counter/k/")[0] == 200
    pid = c.ctl_workers()["counter:k"]["pid"]
    os.kill(pid, signal.SIGKILL)
    entry = c.wait_status("counter:k", "failed")
    assert entry["error"].get("code") == "worker_exited", entry
    starts = c.starts()
    status, headers, body = c.get("/counter/k/")
    assert_json_error(status, headers, body)
    time.sleep(0.3)
    assert c.starts() == starts and c.worker_pids() == set()
    assert "signal 9" in c.srv.log()
    assert 'worker_failed address="counter:k"' in c.srv.log()
    assert c.ctl("retry", "counter:k").returncode == 0
    assert c.get("/counter/k/")[0] == 200
    assert c.running_pid("counter:k") != pid


def test_fatal_is_redacted(corral, worker_kind):
    c = corral(worker_kind)
    responses = []
    responses.append(c.get("/counter/f/"))
    pid = c.running_pid("counter:f")
    responses.append(c.get("/counter/f/fatal"))
    entry = c.wait_status("counter:f", "failed")
    assert entry["error"]["message"] == REDACTED, entry
    assert entry["error"].get("code") == "counter_failed"
    poll(lambda: not alive(pid), 5, what="the fatal worker's exit")
    starts = c.starts()
    for _ in range(2):
        r = c.get("/counter/f/")
        responses.append(r)
        err = assert_json_error(*r)
        assert err["message"] == REDACTED
    time.sleep(0.3)
    assert c.starts() == starts and c.worker_pids() == set()
    for status, headers, body in responses:
        assert SECRET.encode() not in body
        assert SECRET not in json.dumps(headers)
    ctl = c.ctl("workers")
    assert ctl.returncode == 0 and SECRET not in ctl.stdout + ctl.stderr
    assert REDACTED in ctl.stdout
    status, body = c.control("GET", "/workers")
    assert status == 200 and SECRET.encode() not in body
    # the full error is in the supervisor's log only
    line = c.srv.wait_log(r"error worker_failed address=\"counter:f\"[^\n]*")
    poll(lambda: SECRET in c.srv.log(), 3, what="the secret in the worker_failed record",
         detail=c.srv.log)
    assert SECRET in c.srv.log()[line.start():]
    # retry clears it
    assert c.ctl("retry", "counter:f").returncode == 0
    assert c.get("/counter/f/")[0] == 200


def test_suspend_resume(corral):
    c = corral("cpp" if os.access(CPP_WORKER, os.X_OK) else "py")
    # suspended before any start: 503 "suspended", nothing forks
    r = c.ctl("suspend", "counter:s")
    assert r.returncode == 0, r.stdout + r.stderr
    st = c.state()["counter:s"]
    assert st.get("suspended") is True and "pid" not in st, st
    status, headers, body = c.get("/counter/s/")
    err = assert_json_error(status, headers, body)
    assert err.get("code") == "suspended" and "suspended" in err["message"].lower(), err
    time.sleep(0.2)
    assert c.starts() == 0 and c.worker_pids() == set()
    r = c.ctl("resume", "counter:s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert c.get("/counter/s/")[0] == 200
    pid = c.running_pid("counter:s")
    # suspending a running address refuses its requests; resume serves them again
    assert c.ctl("suspend", "counter:s").returncode == 0
    err = assert_json_error(*c.get("/counter/s/"))
    assert err.get("code") == "suspended"
    assert c.ctl("resume", "counter:s").returncode == 0
    assert c.get("/counter/s/")[0] == 200
    e = c.state()["counter:s"]
    assert e["status"] == "running" and "suspended" not in e, e
    assert c.ctl("resume", "counter:s").returncode == 1  # not suspended
    # retry also clears a suspension
    assert c.ctl("suspend", "counter:s").returncode == 0
    assert c.ctl("retry", "counter:s").returncode == 0
    assert c.get("/counter/s/")[0] == 200
    assert c.starts() == 1 and c.state()["counter:s"]["pid"] == pid
    # an unknown kind cannot be suspended
    assert c.ctl("suspend", "nokind:1").returncode == 1


def test_stop(corral, worker_kind):
    c = corral(worker_kind)
    c.request("POST", "/counter/t/inc")
    pid = c.running_pid("counter:t")
    r = c.ctl("stop", "counter:t")
    assert r.returncode == 0, r.stdout + r.stderr
    c.wait_gone("counter:t")
    poll(lambda: not alive(pid), 5, what="the stopped worker's exit")
    assert "counter:t" not in c.ctl_workers()
    assert "worker_failed" not in c.srv.log()
    # the closer ran (the count was saved); the next request starts a new one
    assert c.get("/counter/t/")[2] == b"1\n"
    assert c.running_pid("counter:t") != pid
    assert c.ctl("stop", "counter:nothing").returncode == 1


def test_server_process_caches_the_socket_and_forgets_it_on_stop(corral):
    """A running worker's socket is cached in the server process: a burst of requests costs about
    one resolve message to the supervisor per second, not one per request. A stop makes the
    supervisor tell the process to forget it, so the next request starts a new worker at once
    (no stale socket tried)."""
    c = corral("cpp" if os.access(CPP_WORKER, os.X_OK) else "py")

    def proxy_report():
        status, body = c.control("GET", "/processes")
        assert status == 200, body
        procs = [p for p in json.loads(body)["processes"] if p.get("proxy")]
        return procs[0]["proxy"] if len(procs) == 1 else None

    before = poll(proxy_report, 5, what="the server process's proxy report")
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=10)
    for _ in range(200):
        conn.request("GET", "/counter/k/")
        r = conn.getresponse()
        assert r.status == 200
        r.read()
    conn.close()
    elapsed = time.monotonic() - t0
    # a report (every second) that counts all 200
    after = poll(lambda: (r := proxy_report()) and r["requests"] - before["requests"] >= 200 and r,
                 5, what="a report that counts the requests")
    resolves = after["resolves"] - before["resolves"]
    assert 1 <= resolves <= elapsed + 2, (resolves, elapsed)
    assert after["idle_upstreams"] >= 1, after
    pid = c.running_pid("counter:k")
    assert c.ctl("stop", "counter:k").returncode == 0
    c.wait_gone("counter:k")
    # expired entries are only dropped when looked up: 0 here means the supervisor said forget
    poll(lambda: proxy_report()["cached"] == 0, 5, what="the cached socket forgotten")
    assert c.get("/counter/k/")[0] == 200
    assert c.running_pid("counter:k") != pid


def test_concurrent_requests_to_one_worker_each_get_their_own_answer(corral):
    """Many clients at once on one address: the proxy writes the requests of a loop round together
    and pipelines the GETs on few upstream connections. Every client must get the answer to its
    own request, in order; the slow ones (60 ms, longer than the proxy's 20 ms stall rescue) must
    not hold the others; the POSTs (never pipelined) all count."""
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    c = corral("cpp")
    assert c.get("/counter/q/")[2] == b"0\n"
    errors = []
    answered = []  # checked answers (not the slow ones)

    def client(n):
        conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=20)
        try:
            for i in range(25):
                if n % 4 == 0 and i % 5 == 0:
                    conn.request("GET", "/counter/q/slow?ms=60")
                    want = b"slow 60 ms\n"
                elif n % 4 == 1 and i % 5 == 0:
                    conn.request("POST", "/counter/q/inc", body=b"")
                    want = None
                else:
                    conn.request("GET", f"/counter/q/query?c={n}&i={i}")
                    want = f"c={n}&i={i}\n".encode()
                r = conn.getresponse()
                body = r.read()
                if r.status != 200 or (want is not None and body != want):
                    errors.append((n, i, r.status, body))
                elif want is not None and want != b"slow 60 ms\n":
                    answered.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((n, "exception", repr(e)))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:10]
    assert len(answered) == 32 * 25 - 8 * 5 - 8 * 5

    def pipelined():  # from the server process's next report (every second)
        status, body = c.control("GET", "/processes")
        reports = [p["proxy"] for p in json.loads(body)["processes"] if p.get("proxy")]
        return reports and reports[0]["pipelined"] > 0
    poll(pipelined, 5, what="pipelined requests in the proxy report")
    # 8 clients made 5 POSTs each: every one counted once
    assert c.get("/counter/q/")[2] == b"40\n"
    assert "worker_failed" not in c.srv.log()


def test_many_addresses_at_once(corral, worker_kind):
    n = 50
    c = corral(worker_kind, idle="1s")
    fds_before = supervisor_fds(c)

    def first(i):
        return c.request("POST", f"/counter/m{i}/inc", timeout=30)

    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(first, range(n)))
    bad = [(i, r[0], r[1].get("corral-proxy-error"), r[2]) for i, r in enumerate(results)
           if (r[0], r[2]) != (200, b"1\n")]
    assert not bad, f"{bad[:5]}\nlog:\n{c.srv.log()[-6000:]}"
    assert c.starts() == n
    st = c.state()
    pids = {e["pid"] for e in st.values() if "pid" in e}
    assert len(st) <= n
    # all stopped once idle; no state entry and no worker process left
    poll(lambda: c.state() == {}, 15, interval=0.1, what="all idle-stopped",
         detail=lambda: json.dumps(c.state()))
    poll(lambda: c.worker_pids() == set() and not any(alive(p) for p in pids), 5,
         what="no worker process left", detail=lambda: str(c.worker_pids()))
    assert "worker_failed" not in c.srv.log()
    assert os.listdir(os.path.join(c.state_dir, "sockets")) == []
    # no descriptor left behind in the supervisor (the kind's log file may now be open); polled,
    # because the control connection the line above just closed is closed by the supervisor on
    # its next loop round
    def extra_fds():
        return [t for t in supervisor_fds(c) if t not in fds_before]

    poll(lambda: all(t.endswith("/logs/counter.log") for t in extra_fds()), 3, interval=0.05,
         what="no descriptor left in the supervisor", detail=lambda: str(extra_fds()))
    # concurrent first requests for one address: one fork, every waiter answered
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        results = list(ex.map(lambda _: c.get("/counter/same/", timeout=30), range(20)))
    assert [r[0] for r in results] == [200] * 20, results[:3]
    assert c.starts() == n + 1


def test_per_address_lock(corral, worker_kind):
    c = corral(worker_kind)
    assert c.get("/counter/l/")[0] == 200
    pid = c.running_pid("counter:l")
    lock = os.path.join(c.state_dir, "locks", "counter%3Al.lock")
    assert os.path.exists(lock)
    fd = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the live worker holds it
        os.kill(pid, signal.SIGKILL)
        # Not /proc/<pid>/stat turning "Z": a multithreaded worker's (the Python one's) leader
        # shows Z while its other threads are still exiting and still hold the descriptor table,
        # and so the lock. The manager's pidfd reports the exit once the whole thread group is
        # gone: from then on the lock must be free.
        c.wait_status("counter:l", "failed")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no stale lock after kill -9
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def test_sigterm_stops_every_worker(corral, worker_kind):
    c = corral(worker_kind)
    for i in range(3):
        assert c.get(f"/counter/q{i}/")[0] == 200
    st = c.state()
    pids = {e["pid"] for e in st.values()}
    assert len(pids) == 3 and c.worker_pids() == pids
    c.srv.signal(signal.SIGTERM)
    assert c.srv.wait_exit(timeout=15) == 0, c.srv.log()[-3000:]
    for p in pids:
        poll(lambda: not alive(p), 3, what=f"worker {p} gone")
    log = c.srv.log()
    assert "worker_failed" not in log, log[-3000:]
    assert log.count("worker_exited") >= 3
    assert not os.path.exists(os.path.join(c.state_dir, "control.sock"))


def supervisor_fds(c):
    """The supervisor's descriptors as a sorted list of their targets."""
    d = f"/proc/{c.srv.proc.pid}/fd"
    out = []
    for fd in os.listdir(d):
        try:
            out.append(os.readlink(os.path.join(d, fd)))
        except OSError:
            pass
    return sorted(out)


class Watch:
    """GET /workers/watch on the control socket: a chunked ndjson stream."""

    def __init__(self, state_dir):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5)
        self.s.connect(os.path.join(state_dir, "control.sock"))
        self.s.sendall(b"GET /workers/watch HTTP/1.1\r\nHost: localhost\r\n\r\n")
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.head = head.decode("latin-1")
        self.chunked = "transfer-encoding: chunked" in self.head.lower()
        self.data = b""
        self.raw = b""

    def _more(self):
        b = self.s.recv(65536)
        if not b:
            raise ConnectionError("watch stream closed")
        self.buf += b

    def _decode(self):
        if not self.chunked:
            self.data += self.buf
            self.buf = b""
            return
        while True:
            nl = self.buf.find(b"\r\n")
            if nl < 0:
                return
            size = int(self.buf[:nl].split(b";")[0], 16)
            if len(self.buf) < nl + 2 + size + 2:
                return
            self.data += self.buf[nl + 2:nl + 2 + size]
            self.buf = self.buf[nl + 2 + size + 2:]

    def line(self, timeout=5):
        deadline = time.monotonic() + timeout
        while True:
            self._decode()
            if b"\n" in self.data:
                line, _, self.data = self.data.partition(b"\n")
                self.raw += line + b"\n"
                return json.loads(line)
            if time.monotonic() > deadline:
                raise AssertionError(f"no watch line; got {self.raw!r}")
            self.s.settimeout(max(0.05, deadline - time.monotonic()))
            self._more()

    def until(self, pred, timeout=5):
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.line(max(0.05, deadline - time.monotonic()))
            seen.append(ev)
            if pred(ev):
                return seen

    def close(self):
        self.s.close()


def test_watch_stream_shows_start_and_stop(corral):
    c = corral("py")
    w = Watch(c.state_dir)
    try:
        assert " 200 " in w.head.split("\r\n")[0], w.head
        assert "ndjson" in w.head.lower()
        assert w.line() == {"state": {}}
        assert c.get("/counter/w/")[0] == 200
        seen = w.until(lambda ev: ev.get("address") == "counter:w"
                       and (ev.get("entry") or {}).get("status") == "running")
        statuses = [(ev["entry"] or {}).get("status") for ev in seen
                    if ev.get("address") == "counter:w"]
        assert statuses[0] == "starting", seen
        assert statuses[-1] == "running"
        running = seen[-1]["entry"]
        assert running["pid"] == c.state()["counter:w"]["pid"]
        # a stop: stopping, then no entry (null)
        assert c.ctl("stop", "counter:w").returncode == 0
        seen = w.until(lambda ev: ev.get("address") == "counter:w" and ev.get("entry") is None)
        # a fatal: the failed entry, redacted
        c.get("/counter/w2/fatal")
        seen = w.until(lambda ev: ev.get("address") == "counter:w2"
                       and (ev.get("entry") or {}).get("status") == "failed", timeout=8)
        assert seen[-1]["entry"]["error"]["message"] == REDACTED
        time.sleep(0.3)  # the exit after the fatal, if it changes anything, shows now
        try:
            w.line(timeout=0.2)
        except (AssertionError, socket.timeout):
            pass
        assert SECRET.encode() not in w.raw
    finally:
        w.close()
    # the control server is still fine after a watcher went away
    assert c.state()["counter:w2"]["status"] == "failed"


def test_access_log_target_of_proxied_request(corral):
    c = corral("cpp" if os.access(CPP_WORKER, os.X_OK) else "py")
    for _ in range(3):
        assert c.request("POST", "/counter/log/inc?x=1")[0] == 200
    assert c.get("/counter/log/")[0] == 200
    poll(lambda: len([l for l in c.srv.log().splitlines() if " access " in l]) >= 4, 3,
         what="4 access lines")
    lines = [l for l in c.srv.log().splitlines() if " access " in l]
    targets = [l.split(" target=", 1)[1].split(" status=")[0] for l in lines]
    # the client's target (or at least the rewritten one), never stray bytes
    for t in targets:
        assert t in ("/counter/log/inc?x=1", "/counter/log/", "/inc?x=1", "/"), targets


def test_ctl_address_with_space(corral):
    c = corral("cpp" if os.access(CPP_WORKER, os.X_OK) else "py")
    assert c.get("/counter/a%20b/")[0] == 200
    pid = c.running_pid("counter:a b")
    # the control API takes the percent-encoded address
    status, body = c.control("POST", "/workers/counter:a%20b/suspend")
    assert status == 202, body
    status, body = c.control("POST", "/workers/counter:a%20b/resume")
    assert status == 202, body
    # and so must `corral ctl` (it has to encode the address)
    r = c.ctl("stop", "counter:a b")
    assert r.returncode == 0, r.stdout + r.stderr
    c.wait_gone("counter:a b")
    poll(lambda: not alive(pid), 5, what="the stopped worker's exit")


def test_supervisor_kill9_takes_workers_and_restart_resumes(corral, worker_kind):
    c = corral(worker_kind)
    assert c.request("POST", "/counter/r/inc")[2] == b"1\n"
    assert c.request("POST", "/counter/r/inc")[2] == b"2\n"
    pid = c.running_pid("counter:r")
    c.srv.signal(signal.SIGKILL)
    c.srv.wait_exit(timeout=5)
    # the parent's death stops the worker (it runs its closers: the count is saved)
    poll(lambda: not alive(pid), 5, what="the orphaned worker's exit")
    # a new corral on the same state directory (a stale control.sock is left behind)
    c2 = corral(worker_kind)
    status, _, body = c2.get("/counter/r/")
    assert (status, body) == (200, b"2\n")
    assert c2.running_pid("counter:r") != pid


def test_start_during_stop_waits_for_the_old_worker(corral, worker_kind):
    c = corral(worker_kind)
    for i in range(3):
        assert c.request("POST", "/counter/sds/inc")[2] == f"{i + 1}\n".encode()
    pid = c.running_pid("counter:sds")
    assert c.ctl("stop", "counter:sds").returncode == 0
    # at once: this start waits for the old worker's exit (its closer saves the count first)
    status, _, body = c.get("/counter/sds/")
    assert (status, body) == (200, b"3\n")
    assert not alive(pid)
    assert c.running_pid("counter:sds") != pid
    assert "worker_failed" not in c.srv.log()


def test_failed_starts(corral, tmp_path):
    """A start timer, an exec that fails, a program that exits before `started`: each failed,
    503 at once, no new fork; the start timer kills the whole process group."""
    # `corral check` (and so serve) refuses a program that does not exist: this one is removed
    # once corral runs, so its exec fails.
    gone = tmp_path / "removed-worker"
    gone.write_text("#!/bin/sh\nexit 0\n")
    gone.chmod(0o755)
    hang = tmp_path / "hang.py"
    hang.write_text("import subprocess, time\n"
                    "subprocess.Popen(['sleep', '300'])\n"  # a grandchild in its process group
                    "time.sleep(300)\n")
    extra = f"""
[workers.hang]
command = ["/usr/bin/python3", {toml_str(str(hang))}]
routes = ["/hang/{{id}}/*"]
start_timeout = "1s"
[workers.nope]
command = [{toml_str(str(gone))}]
routes = ["/nope/{{id}}/*"]
[workers.quit]
command = ["/bin/true"]
routes = ["/quit/{{id}}/*"]
"""
    c = corral("py", extra=extra)
    gone.unlink()
    t0 = time.monotonic()
    err = assert_json_error(*c.get("/hang/1/"))
    assert 0.9 <= time.monotonic() - t0 < 5
    assert err.get("code") == "start_timeout", err
    m = c.srv.wait_log(r'worker_starting address="hang:1" pid=(\d+)')
    pid = int(m.group(1))
    poll(lambda: not alive(pid), 3, what="the timed-out worker killed")
    # the grandchild went with its process group
    def grandchildren():
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if os.getpgid(int(d)) == pid:
                        out.append(int(d))
                except ProcessLookupError:
                    pass
        return out
    poll(lambda: not [p for p in grandchildren() if alive(p)], 3, what="the process group gone",
         detail=lambda: str(grandchildren()))
    for path, code in (("/nope/1/", "worker_exited"), ("/quit/1/", "worker_exited")):
        err = assert_json_error(*c.get(path))
        assert err.get("code") == code, err
    starts = c.starts()
    for path in ("/hang/1/", "/nope/1/", "/quit/1/"):
        assert_json_error(*c.get(path))
    time.sleep(0.2)
    assert c.starts() == starts
    st = c.state()
    assert {a: e["status"] for a, e in st.items()} == {
        "hang:1": "failed", "nope:1": "failed", "quit:1": "failed"}, st


def test_upgrade_to_a_worker_passes_the_origin_check_first(corral):
    """A WebSocket upgrade for a worker's address is checked by the ws component (Origin) before
    anything starts: a foreign Origin gets 403 and no worker is forked."""
    c = corral("py")
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    status, _, _ = c.get("/counter/ws/", headers={**upgrade, "Origin": "http://evil.example"})
    assert status == 403
    assert c.starts() == 0 and c.state() == {}
    # A bad key is refused the same way, before any fork.
    status, _, _ = c.get("/counter/ws/", headers={**upgrade, "Sec-WebSocket-Key": "short"})
    assert status == 400
    assert c.starts() == 0
    # The request's own origin passes the check and reaches the worker (which has no socket route).
    own = f"http://127.0.0.1:{c.srv.port}"
    status, _, _ = c.get("/counter/ws/", headers={**upgrade, "Origin": own})
    assert status != 403
    assert c.starts() == 1


def ws_frame(opcode, payload):
    """A masked client frame (payload < 126 bytes)."""
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + key + masked


def test_open_websocket_keeps_worker_past_idle(corral):
    """An upgraded connection relayed to the worker (the C++ example's /echo) keeps it from being
    idle (idle 1 s, the socket open for 2.5 s); once it is closed the worker is idle-stopped."""
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")  # the Python example has no WebSocket route
    c = corral("cpp", idle="1s")
    assert c.get("/counter/ws/")[0] == 200
    pid = c.running_pid("counter:ws")
    s = socket.create_connection((c.srv.host, c.srv.port), timeout=5)
    try:
        # Host and Origin "localhost": the same origin at the proxy and at the worker (which the
        # proxy reaches with Host: localhost).
        s.sendall(b"GET /counter/ws/echo HTTP/1.1\r\nHost: localhost\r\n"
                  b"Origin: http://localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(4096)
            assert b, head
            head += b
        assert head.startswith(b"HTTP/1.1 101"), head
        rest = head.split(b"\r\n\r\n", 1)[1]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:  # the socket stays open, quiet, past `idle`
            time.sleep(0.1)
        s.sendall(ws_frame(0x1, b"still here"))
        while len(rest) < 2 + len(b"still here"):
            b = s.recv(4096)
            assert b, rest
            rest += b
        assert rest[:2] == bytes([0x81, len(b"still here")]) and rest[2:12] == b"still here", rest
        assert 'worker_stopping address="counter:ws"' not in c.srv.log(), c.srv.log()[-3000:]
        assert c.state()["counter:ws"]["pid"] == pid and alive(pid)
        s.sendall(ws_frame(0x8, (1000).to_bytes(2, "big")))
    finally:
        s.close()
    c.wait_gone("counter:ws", timeout=5)
    poll(lambda: not alive(pid), 3, what="the worker's exit")
    assert c.starts() == 1 and "worker_failed" not in c.srv.log()
