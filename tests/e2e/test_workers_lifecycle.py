"""Workers (issue 4): the lifecycle cases of the spec's §7 list that test_workers.py does not reach
with the example workers, on the real binary. The worker here is tests/workers/fake_worker.py (the
manager tests' double) configured through the kind's `env` (FAKE_WORKER_START: its start data,
FAKE_WORKER_HTTP=1: it answers every connection with a 200 "hello <address>"), so it can be slow
between `started` and `ready`, crash before `ready`, or close its link while it lives.

Cases (docs/workers-tests.md has the whole table):
  * `started` before a slow setup; the start timer does not kill a slow `ready`;
  * the lock: a start waits while another process holds the address's lock (an old worker), and
    goes on when it is released (example workers, both languages);
  * stop during start (before `started`, and between `started` and `ready`): the stop waits for the
    start, then stops; the waiter gets 503 "stopped"; nothing is failed;
  * a crash while starts are queued: every waiter gets the 503 JSON, nothing forks until retry;
  * a lost link with a live child before `ready`: failed, the child killed after stop_grace, no new
    fork, retry clears it; after `ready`: recovered once, the second within a minute fails;
  * a worker idle from its start (it never reports a flip) is stopped after `idle`;
  * `close` (SIGTERM to the supervisor) cancelling a start: no `worker_failed`, exit 0.

Every wait polls an observable (state, the events file the fake writes, /proc, the log) with a
deadline; fixed pauses only bound windows in which something that must not happen would show.
"""
import concurrent.futures
import fcntl
import http.client
import json
import os
import signal
import time

import pytest

from conftest import CORRAL_BIN
import test_workers
from corral_test_util import alive, poll, wait_control_socket
from test_workers import CPP_WORKER, Corral, assert_json_error, toml_str

corral = test_workers.corral  # the fixture, shared with test_workers.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")


@pytest.fixture
def fake(server_factory, tmp_path):
    """fake(start_data, **kind settings) -> a Corral with the kind `fake` on "/fake/{id}/*"."""

    def make(start=None, idle=None, start_timeout=None, stop_grace=None, ready_timeout=None):
        state = tmp_path / "state"
        events = tmp_path / "events.txt"
        data = dict(start or {})
        data["events"] = str(events)
        lines = ["[workers.fake]",
                 f"command = [\"/usr/bin/python3\", \"-S\", {toml_str(FAKE)}]",
                 'routes = ["/fake/{id}/*"]',
                 f"env = {{ FAKE_WORKER_HTTP = \"1\", FAKE_WORKER_START = {toml_str(json.dumps(data))} }}"]
        for key, value in (("idle", idle), ("start_timeout", start_timeout),
                           ("stop_grace", stop_grace), ("ready_timeout", ready_timeout)):
            if value is not None:
                lines.append(f"{key} = {toml_str(value)}")
        srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN,
                             config="\n".join(lines) + "\n")
        c = Corral(srv, str(state), "fake_worker.py")
        c.events_path = str(events)
        wait_control_socket(c.state_dir, 5, what="control socket")
        return c

    return make


def events(c):
    """[(pid, event)] the fake workers wrote (started, ready, link_closed, exiting)."""
    try:
        with open(c.events_path) as f:
            return [(int(p), e) for _, p, e in (line.split() for line in f if line.strip())]
    except FileNotFoundError:
        return []


def pid_with(c, event):
    for p, e in events(c):
        if e == event:
            return p
    return None


def in_background(fn, *args):
    ex = concurrent.futures.ThreadPoolExecutor(1)
    fut = ex.submit(fn, *args)
    ex.shutdown(wait=False)
    return fut


def test_started_before_slow_setup_and_start_timer_spares_a_slow_ready(fake):
    # ready comes 2.5 s after `started`, the start timer is 1 s: it covers only fork, lock, started.
    # (The setup has a bound of its own, ready_timeout: by default 3 x start_timeout, so close to
    # 2.5 s here; test_worker_ready_timeout.py.)
    c = fake({"slow_ready": 2500}, start_timeout="1s", ready_timeout="30s")
    fut = in_background(c.get, "/fake/a/")
    pid = poll(lambda: pid_with(c, "started"), 5, what="`started`")
    e = c.state()["fake:a"]
    assert e["status"] == "starting" and e["pid"] == pid, e
    status, _, body = fut.result(timeout=15)
    assert (status, body) == (200, b"hello fake:a\n")
    assert [ev for p, ev in events(c) if p == pid][:2] == ["started", "ready"]
    assert c.running_pid("fake:a") == pid and alive(pid)
    assert c.starts() == 1
    assert "worker_failed" not in c.srv.log()


@pytest.mark.parametrize("kind", ["py", "cpp"])
def test_start_waits_for_an_old_workers_lock(corral, kind):
    """Another process holds the address's lock (an old worker of a previous corral): the start
    stays `starting` (no `started`, no answer) until the lock is released, then serves."""
    if kind == "cpp" and not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    c = corral(kind)
    lock = os.path.join(c.state_dir, "locks", "counter%3Aold.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fut = in_background(c.request, "GET", "/counter/old/", None, None, 20)
        e = c.wait_status("counter:old", "starting")
        time.sleep(0.5)  # the window in which an answer would come if the lock were ignored
        assert not fut.done()
        assert c.state()["counter:old"]["status"] == "starting"
        assert c.worker_pids() == {e["pid"]}
    finally:
        os.close(fd)  # the "old worker" exits
    status, _, body = fut.result(timeout=15)
    assert (status, body) == (200, b"0\n")
    assert c.running_pid("counter:old") == e["pid"]
    assert c.starts() == 1 and "worker_failed" not in c.srv.log()


def test_stop_before_started_waits_for_the_start_then_stops(fake):
    """The stop arrives while the worker waits for its lock (held here): it waits for `started`,
    then stops the worker; the waiter gets 503 "stopped"; no failure; the next request starts."""
    c = fake()
    lock = os.path.join(c.state_dir, "locks", "fake%3As.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fut = in_background(c.get, "/fake/s/")
        c.wait_status("fake:s", "starting")
        r = c.ctl("stop", "fake:s")
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(0.3)  # the stop must not end the start before `started`
        assert c.state()["fake:s"]["status"] == "starting"
        assert not fut.done()
    finally:
        os.close(fd)
    err = assert_json_error(*fut.result(timeout=15))
    assert err.get("code") == "stopped", err
    c.wait_gone("fake:s")
    pid = pid_with(c, "started")
    assert pid and ("exiting" in [ev for p, ev in events(c) if p == pid])  # a shutdown, no kill
    poll(lambda: not alive(pid), 5, what="the stopped worker's exit")
    assert "worker_failed" not in c.srv.log()
    assert c.starts() == 1
    assert c.get("/fake/s/")[0] == 200
    assert c.starts() == 2


def test_stop_between_started_and_ready_then_start_during_stop(fake):
    c = fake({"slow_ready": 1500})
    fut = in_background(c.get, "/fake/r/")
    pid = poll(lambda: pid_with(c, "started"), 5, what="`started`")
    assert c.wait_status("fake:r", "starting")["pid"] == pid
    assert c.ctl("stop", "fake:r").returncode == 0
    # a request during that stop waits for the exit, then starts a new worker
    second = in_background(c.request, "GET", "/fake/r/", None, None, 20)
    err = assert_json_error(*fut.result(timeout=15))
    assert err.get("code") == "stopped", err
    status, _, body = second.result(timeout=20)
    assert (status, body) == (200, b"hello fake:r\n")
    new_pid = c.running_pid("fake:r")
    assert new_pid != pid and not alive(pid)
    assert c.starts() == 2
    assert "worker_failed" not in c.srv.log()


def test_crash_while_starts_are_queued(fake):
    c = fake({"mode": "crash_before_ready", "crash_after": 500})
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda _: c.get("/fake/x/", timeout=20), range(6)))
    errors = [assert_json_error(*r) for r in results]
    assert all(e.get("code") == "worker_exited" for e in errors), errors
    assert c.starts() == 1
    entry = c.wait_status("fake:x", "failed")
    assert entry["error"]["code"] == "worker_exited"
    pid = pid_with(c, "started")
    poll(lambda: not alive(pid), 5, what="the crashed worker gone")
    err = assert_json_error(*c.get("/fake/x/"))
    assert err.get("code") == "worker_exited"
    time.sleep(0.3)  # a fork would show by now
    assert c.starts() == 1 and c.worker_pids() == set()
    assert 'worker_failed address="fake:x"' in c.srv.log()
    # retry clears it: the next request forks again (and this fake crashes again)
    assert c.ctl("retry", "fake:x").returncode == 0
    assert_json_error(*c.get("/fake/x/"))
    assert c.starts() == 2


def test_lost_link_before_ready_with_a_live_child(fake):
    """fd 3 closed after `started`, the child alive and deaf to SIGTERM: the address fails, the
    child is killed after stop_grace (SIGKILL), nothing forks until retry."""
    c = fake({"mode": "close_link_before_ready"}, stop_grace="1s")
    err = assert_json_error(*c.get("/fake/l/"))
    assert err.get("code") == "link_lost", err
    pid = pid_with(c, "link_closed")
    assert pid
    c.wait_status("fake:l", "failed")
    poll(lambda: not alive(pid), 5, what="the linkless worker killed")
    c.srv.wait_log(rf'worker_exited address="fake:l" pid={pid} how="signal 9"')
    c.srv.wait_log(r'worker_failed address="fake:l"')
    assert_json_error(*c.get("/fake/l/"))
    time.sleep(0.3)
    assert c.starts() == 1 and c.worker_pids() == set()
    assert c.ctl("retry", "fake:l").returncode == 0
    assert_json_error(*c.get("/fake/l/"))
    assert c.starts() == 2


def test_lost_link_after_ready_recovered_once_then_failed(fake):
    c = fake({"mode": "close_link"}, stop_grace="1s")
    assert c.get("/fake/k/")[0] == 200
    c.srv.wait_log(r'worker_link_lost address="fake:k"')
    c.wait_gone("fake:k")
    assert "worker_failed" not in c.srv.log()
    # the next request starts a new worker; its lost link within the minute fails the address
    assert c.get("/fake/k/")[0] == 200
    assert c.starts() == 2
    entry = c.wait_status("fake:k", "failed")
    assert entry["error"]["code"] == "link_lost"
    poll(lambda: c.worker_pids() == set(), 5, what="the second worker killed")
    assert_json_error(*c.get("/fake/k/"))
    time.sleep(0.3)
    assert c.starts() == 2


def test_worker_idle_from_its_start_is_stopped(fake):
    """`ready {idle: true}` and never a flip: stopped after `idle` all the same."""
    c = fake(idle="1s")
    assert c.get("/fake/i/")[0] == 200
    pid = c.running_pid("fake:i")
    c.wait_gone("fake:i", timeout=5)
    poll(lambda: not alive(pid), 5, what="the idle worker's exit")
    assert [ev for p, ev in events(c) if p == pid] == ["started", "ready", "exiting"]
    assert "worker_failed" not in c.srv.log()


def test_post_waiting_to_be_accepted_is_not_lost_to_the_idle_stop(fake):
    """The first POST to an address reaches the worker's socket, but the worker takes longer
    than `idle` to accept it (as a loaded machine makes a worker slow): the worker says idle all
    the while, yet the connection waiting in its accept queue keeps it, and the POST is answered.
    (Stopped with it queued, the connection was reset and the POST, which the proxy cannot know
    had not been read, got a 502: the flake of test_many_addresses_at_once under load.)"""
    c = fake({"accept_after": 3000}, idle="500ms")
    status, headers, body = c.request("POST", "/fake/q/x", body=b"", timeout=30)
    assert (status, body) == (200, b"hello fake:q\n"), \
        (status, headers.get("corral-proxy-error"), c.srv.log()[-3000:])
    assert c.starts() == 1
    pid = pid_with(c, "accepting")
    c.wait_gone("fake:q", timeout=10)  # idle again once it was served
    poll(lambda: not alive(pid), 5, what="the idle worker's exit")
    assert "worker_failed" not in c.srv.log()


def test_close_cancels_a_start_and_reports_no_failure(fake):
    """SIGTERM to the supervisor while a worker is between `started` and `ready`: the start is
    cancelled (its waiter gets an error or loses its connection), the worker stopped, exit 0,
    no `worker_failed`."""
    c = fake({"slow_ready": 60000}, stop_grace="1s")
    fut = in_background(c.request, "GET", "/fake/c/", None, None, 20)
    pid = poll(lambda: pid_with(c, "started"), 5, what="`started`")
    assert c.wait_status("fake:c", "starting")["pid"] == pid
    c.srv.signal(signal.SIGTERM)
    assert c.srv.wait_exit(timeout=15) == 0, c.srv.log()[-3000:]
    try:
        status, _, _ = fut.result(timeout=15)
        assert status == 503, status
    except (ConnectionError, http.client.HTTPException):
        pass  # the server process went away with the request
    poll(lambda: not alive(pid), 5, what="the starting worker's exit")
    log = c.srv.log()
    assert "worker_failed" not in log, log[-3000:]
    assert f'worker_exited address="fake:c" pid={pid}' in log
    assert not os.path.exists(os.path.join(c.state_dir, "control.sock"))
