"""A worker that hangs, and what holds a worker (issue 14), on the real binary.

  * response_timeout: a kind with `response_timeout = "1s"` whose worker takes a request and never
    answers it in time (the Python example's GET /slow?ms=8000) -> 504 after about 1 s, a JSON
    error with the code worker_timeout, a `worker_timeout` line naming the address and the timeout;
    other addresses (and the same worker's other requests) keep being served.
  * heartbeat: a C++ example worker whose loop blocks (GET /block?ms=30000 sleeps in its handler:
    no request and no pong is handled meanwhile) is stopped as unresponsive (`worker_unresponsive`,
    then the lost-link line) within the heartbeat timeout (2 x `heartbeat`), killed after its stop
    grace, and the next request gets a new worker.
  * why alive: GET /workers (and `corral ctl workers`) shows a running worker's `holds` while a
    long request is in flight (requests >= 1, idle_stop_at null), and idle_since / idle_stop_at
    (idle_since + `idle`) once it is idle; for the C++, Python and Node.js workers.
  * `corral check` names a bad `response_timeout` or `heartbeat`.

Every wait polls an observable (the state, the log, a response) with a deadline.
"""
import calendar
import http.client
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_request, ctl, poll, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
NODE_WORKER = os.path.join(REPO, "examples", "worker_node", "worker.mjs")

WORKERS = {
    "py": [sys.executable or "/usr/bin/python3", PY_WORKER],
    "cpp": [CPP_WORKER],
    "node": [os.environ.get("CORRAL_NODE", "node"), NODE_WORKER],
}


class Corral:
    """A running `corral serve` with one worker kind `counter` on "/counter/{id}/*"."""

    def __init__(self, srv, state_dir):
        self.srv = srv
        self.state_dir = state_dir

    def get(self, path, timeout=20):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def state(self):
        status, body = control_request(self.state_dir, "GET", "/workers", 5)
        assert status == 200, body
        return json.loads(body)

    def entry(self, address):
        return self.state().get(address)

    def wait_entry(self, address, check, what, timeout=10):
        def probe():
            e = self.entry(address)
            return e if e and check(e) else None
        return poll(probe, timeout, what=what,
                    detail=lambda: f"state={self.state()}\nlog:\n{self.srv.log()[-3000:]}")


@pytest.fixture
def corral(server_factory, tmp_path):
    def make(kind="py", **keys):
        if kind == "cpp" and not os.access(CPP_WORKER, os.X_OK):
            pytest.skip(f"{CPP_WORKER} is not built")
        lines = ["[workers.counter]",
                 f"command = [{', '.join(json.dumps(a) for a in WORKERS[kind])}]",
                 'routes = ["/counter/{id}/*"]']
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        state = tmp_path / "state"
        srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN,
                             config="\n".join(lines) + "\n")
        c = Corral(srv, str(state))
        wait_control_socket(c.state_dir, 5, what="control socket")
        return c

    return make


def in_thread(fn):
    """Runs fn() on a thread; returns (thread, result dict with "value" or "error")."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def iso(text):
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def test_a_hanging_request_gets_504_after_the_kinds_response_timeout(corral):
    c = corral("py", response_timeout="1s")
    assert c.get("/counter/a/")[0] == 200
    began = time.monotonic()
    t, hung = in_thread(lambda: c.get("/counter/a/slow?ms=8000"))
    # Meanwhile the same worker's other requests and other addresses are served.
    assert c.get("/counter/a/")[0] == 200
    assert c.get("/counter/b/")[0] == 200
    t.join(10)
    took = time.monotonic() - began
    assert "value" in hung, hung
    status, headers, body = hung["value"]
    assert status == 504, (status, body)
    assert 0.9 <= took < 4, took
    assert headers["content-type"].startswith("application/json"), headers
    assert json.loads(body) == {"error": {"message": "The worker did not answer in time.",
                                          "code": "worker_timeout"}}
    c.srv.wait_log(r'worker_timeout address="counter:a" method=GET response_timeout_ms=1000')
    # The worker is still the same one, and still serves.
    assert c.entry("counter:a")["status"] == "running"
    assert c.get("/counter/a/")[0] == 200


def test_a_worker_whose_loop_blocks_is_stopped_as_unresponsive(corral):
    # The blocked request itself gets its 504 after 1 s (before the worker is stopped: a GET the
    # proxy saw cut would be sent again, to the next worker); the heartbeat finds the loop stuck
    # within 2 x 1 s of a ping.
    c = corral("cpp", heartbeat="1s", response_timeout="1s", stop_grace="1s")
    assert c.get("/counter/x/")[0] == 200
    first = c.entry("counter:x")["pid"]
    began = time.monotonic()
    t, blocked = in_thread(lambda: c.get("/counter/x/block?ms=30000", timeout=40))
    c.srv.wait_log(rf'worker_unresponsive address="counter:x" pid={first} ', timeout=10)
    detected = time.monotonic() - began
    assert detected < 4, detected  # a ping every second, its pong due within 2 s
    c.srv.wait_log(rf'worker_link_lost address="counter:x" pid={first} action=stop '
                   r'reason=unresponsive')
    t.join(10)
    assert blocked.get("value", (None,))[0] == 504, blocked
    # The next request gets a new worker (once the stuck one is killed after its stop grace).
    status, _, body = c.get("/counter/x/")
    assert (status, body) == (200, b"0\n"), (status, body)
    second = c.wait_entry("counter:x", lambda e: e.get("status") == "running",
                          "counter:x running")["pid"]
    assert second != first
    c.srv.wait_log(rf'worker_exited address="counter:x" pid={first} how="signal 9"')
    assert "worker_failed" not in c.srv.log()


@pytest.mark.parametrize("kind", ["py", "cpp", "node"])
def test_workers_state_shows_what_holds_a_worker(corral, kind):
    c = corral(kind, idle="30s")
    assert c.get("/counter/h/")[0] == 200
    t, slow = in_thread(lambda: c.get("/counter/h/slow?ms=2500"))
    e = c.wait_entry("counter:h", lambda e: (e.get("holds") or {}).get("requests", 0) >= 1,
                     "a request in flight in holds")
    assert e["status"] == "running"
    assert e["idle_since"] is None and e["idle_stop_at"] is None, e
    assert e["holds"]["upgraded"] == 0 and e["holds"]["busy"] == 0, e
    # `corral ctl workers` shows it as a row.
    r = ctl(c.state_dir, "workers")
    assert r.returncode == 0, r.stdout + r.stderr
    row = [line for line in r.stdout.splitlines() if line.startswith("counter:h ")]
    assert row and "running" in row[0] and "requests=" in row[0], r.stdout
    t.join(10)
    assert slow.get("value", (None,))[0] == 200, slow
    e = c.wait_entry("counter:h", lambda e: isinstance(e.get("idle_stop_at"), str),
                     "idle_stop_at once idle")
    assert e["holds"] == {"requests": 0, "upgraded": 0, "busy": 0}, e
    assert iso(e["idle_stop_at"]) - iso(e["idle_since"]) == 30, e
    assert abs(iso(e["idle_since"]) - time.time()) < 10, e
    r = ctl(c.state_dir, "workers", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["counter:h"]["idle_stop_at"] == e["idle_stop_at"]


def test_check_names_bad_response_timeout_and_heartbeat(tmp_path):
    def check(keys):
        cfg = tmp_path / "corral.toml"
        cfg.write_text("\n".join(["[workers.doc]",
                                  f"command = [{', '.join(json.dumps(a) for a in WORKERS['py'])}]",
                                  'routes = ["/doc/{id}/*"]', *keys]) + "\n")
        return subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)

    r = check(['response_timeout = "soon"', 'heartbeat = "often"'])
    assert r.returncode == 78, r
    assert "workers.doc.response_timeout: 'soon' is not a duration" in r.stderr, r.stderr
    assert "workers.doc.heartbeat: 'often' is not a duration" in r.stderr, r.stderr
    r = check(["response_timeout = 0"])
    assert r.returncode == 78 and "workers.doc.response_timeout: must be more than 0" in r.stderr, r
    r = check(['response_timeout = "250ms"', "heartbeat = 0"])
    assert r.returncode == 0, r.stderr
