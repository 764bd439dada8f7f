"""The Node.js worker library (lib/node/corral-worker.mjs) where the shared protocol suite
(test_worker_protocol.py, which runs it as kind "node") does not look: closers' order and failures,
the forced exit of a stop that hangs (its promise, or its whole event loop), a connection accepted
but not yet read when `shutdown` comes, an upgraded connection, pipelining, exceptions nobody
caught, parent death.

The worker is tests/worker/node_test_worker.mjs, run by the same fake manager. Environment:
CORRAL_NODE (default `node` on PATH).
"""

import json
import os
import signal
import socket
import time

import pytest

from test_worker_protocol import NODE, ROOT, TIMEOUT, FakeManager

WORKER = os.path.join(ROOT, "tests/worker/node_test_worker.mjs")


@pytest.fixture
def managers(tmp_path, monkeypatch):
    made = []

    def make(command=None, **env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        m = FakeManager(command or [NODE, WORKER], str(tmp_path), name=f"w{len(made)}")
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def closers_ran(m):
    try:
        with open(os.path.join(m.state_dir, "closers")) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def raw_connect(m):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(m.sock_path)
    return s


def wait_output(m, text, timeout=TIMEOUT):
    """Until the worker's log holds `text` (it has no other way to say that it is waiting)."""
    deadline = time.monotonic() + timeout
    while text not in m.output():
        assert time.monotonic() < deadline, f"no {text!r} in:\n{m.output()}"
        time.sleep(0.02)


def read_until(s, end):
    data = b""
    while not data.endswith(end):
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    return data


def test_closers_run_in_reverse_order_past_a_throwing_one(managers):
    m = managers(TEST_CLOSER="throws").start_ready()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    assert closers_ran(m) == ["third", "second", "first"]
    assert "closer_failed" in m.output() and "closer broke" in m.output()


def test_a_stop_whose_closer_never_settles_exits_after_3s(managers):
    m = managers(TEST_CLOSER="hang-async").start_ready()
    began = time.monotonic()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0  # the status the stop was for, from the force-exit timer
    took = time.monotonic() - began
    assert 2.9 <= took < 4.5, took
    assert closers_ran(m) == ["third"]  # the hanging one held the rest
    assert "worker_force_exit" in m.output()


def test_a_stop_whose_loop_is_blocked_is_killed_by_the_watchdog(managers):
    m = managers(TEST_CLOSER="hang-sync").start_ready()
    began = time.monotonic()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == -signal.SIGKILL
    took = time.monotonic() - began
    assert 3.0 <= took < 4.8, took


def test_a_connection_accepted_before_shutdown_is_served(managers):
    m = managers().start_ready()
    s = raw_connect(m)
    assert m.expect("idle")["idle"] is False  # accepted: in flight before a byte is read
    m.send({"type": "shutdown"})
    assert m.quiet_for(0.3) and m.proc.poll() is None  # the stop waits for it
    s.sendall(b"GET /late HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = read_until(s, b"ok GET /late\n")
    assert data.startswith(b"HTTP/1.1 200 "), data
    assert m.wait_exit() == 0
    s.close()


def test_a_connection_that_sends_nothing_holds_the_worker_until_it_closes(managers):
    m = managers().start_ready()
    s = raw_connect(m)
    assert m.expect("idle")["idle"] is False
    assert m.quiet_for(0.2)
    s.close()
    assert m.expect("idle")["idle"] is True
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_an_upgraded_connection_holds_the_worker_until_it_closes(managers):
    m = managers().start_ready()
    s = raw_connect(m)
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
              b"Upgrade: echo\r\n\r\nhello")
    data = read_until(s, b"hello")
    assert data.startswith(b"HTTP/1.1 101 "), data
    assert m.expect("idle")["idle"] is False
    s.sendall(b" again")
    assert read_until(s, b" again") == b" again"
    assert m.quiet_for(0.2)  # still open: still not idle
    s.close()
    assert m.expect("idle")["idle"] is True
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_pipelined_requests_are_answered_in_order(managers):
    m = managers().start_ready()
    s = raw_connect(m)
    s.sendall(b"GET /slow?ms=150 HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"GET /b HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"HEAD /c HTTP/1.1\r\nHost: localhost\r\n\r\n")
    data = read_until(s, b"\r\n\r\n")
    while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b"\r\n\r\n"):
        data += read_until(s, b"\r\n\r\n")
    assert data.index(b"slow 150") < data.index(b"ok GET /b"), data
    assert b"ok HEAD" not in data
    s.close()
    m.drain_idle()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_an_exception_nobody_caught_is_a_redacted_fatal(managers):
    m = managers().start_ready()
    assert m.request("GET", "/uncaught") == (200, "soon\n")
    while True:
        msg = m.recv()
        assert msg is not None, m.output()
        if msg["type"] == "fatal":
            break
        assert msg["type"] == "idle"
    assert msg["error"] == {"message": "the test worker failed", "code": "test_failed"}
    assert m.wait_exit() == 1
    assert "secret-789" in m.output()
    assert closers_ran(m) == ["third", "second", "first"]  # a fatal's stop still runs them


def test_a_rejecting_handler_is_a_500_and_the_worker_goes_on(managers):
    m = managers().start_ready()
    assert m.request("GET", "/rejects")[0] == 500
    assert m.request("GET", "/") == (200, "ok GET /\n")
    assert "route_failed" in m.output()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_a_rejecting_setup_is_a_fatal(managers):
    m = managers(TEST_SETUP="rejects").spawn()
    m.send_start()
    m.expect("started")
    msg = m.expect("fatal")
    assert msg["error"] == {"message": "the test worker failed", "code": "test_failed"}
    assert "secret" not in json.dumps(msg)
    assert m.wait_exit() == 1


def test_a_stop_during_an_async_setup_runs_the_closers_it_registers(managers):
    m = managers(TEST_SETUP="slow").spawn()
    m.send_start()
    m.expect("started")
    m.send({"type": "shutdown"})  # setup is still awaiting
    assert m.wait_exit() == 0
    assert closers_ran(m) == ["third", "second", "first"]


def test_sigterm_while_waiting_for_the_lock(managers):
    first = managers().start_ready()
    second = managers().spawn()
    second.send_start()
    wait_output(second, "lock_wait")  # running, its handlers installed, and blocked on the lock
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait_exit(timeout=2) == 0
    first.send({"type": "shutdown"})
    assert first.wait_exit() == 0


def test_parent_death_stops_the_worker(managers):
    # The worker's parent is a shell; the control link stays open here, so only the parent's death
    # (seen through process.ppid) can stop it.
    shell = ["/bin/sh", "-c", f'"{NODE}" "{WORKER}" & wait']
    m = managers(command=shell).start_ready()
    os.kill(m.proc.pid, signal.SIGKILL)  # the shell only
    m.proc.wait()
    assert m.recv(timeout=5) is None, m.output()  # the worker's end closed: it exited
    assert "parent_died" in m.output()
