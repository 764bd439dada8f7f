"""A reload drops nothing (issue 11, defect 11; docs/process-model.md, "Reloads").

On SIGHUP a new generation of server processes starts; once process i of it is ready, the old
process i is told to drain (SIGUSR2): it stops accepting, finishes its requests and keeps its
upgraded connections (WebSockets it serves, upgrades it relays to a worker) until they close or
`timeouts.drain_ms` passes, then exits. At most `max_draining_generations` (default 3: the QUIC
CID's 2 generation bits) older generations drain per slot; past it the oldest is closed and its
WebSockets get 1001.

Real `corral serve --processes 2` with the embedded site's /ws/echo (served) and the C++ example
worker's /echo behind `[workers.counter]` (relayed), raw sockets as clients:
  * sockets opened in each of 4 generations all still echo after 3 reloads, nothing was closed,
    and the control API lists 3 draining generations;
  * new sockets and requests are served by the newest generation;
  * a 4th reload closes the oldest generation first: its served socket gets 1001, its relayed
    one is cut, its processes exit; the others still echo;
  * a socket kept past drain_ms gets 1001 and the old process exits.
Before the fix each SIGHUP sent 1001 to every open WebSocket of the old generation.
"""
import json
import os
import re
import signal
import socket

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, control_request, poll, read_to_eof, wait_control_socket

CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
PROCESSES = 2


def start(server_factory, tmp_path, extra="", args=()):
    state = tmp_path / "state"
    config = f"""
process_header = true
access_log = false
{extra}

[workers.counter]
command = [{json.dumps(CPP_WORKER)}]
routes = ["/counter/{{id}}/*"]
"""
    srv = server_factory("--processes", str(PROCESSES), "--state-dir", str(state), *args,
                         binary=CORRAL_BIN, config=config)
    srv.state_dir = str(state)
    wait_control_socket(srv.state_dir, 10, what="control socket")
    wait_ready(srv, 1)
    return srv


def generation_pids(srv, generation):
    return {int(p) for p in re.findall(rf"process_started slot=\d+ pid=(\d+) cpu=-?\d+ "
                                       rf"generation={generation}\b", srv.log())}


def live(srv, generation):
    """The processes of `generation` that have not exited (from the supervisor's log)."""
    exited = {int(p) for p in re.findall(rf"process_exited slot=\d+ pid=(\d+) "
                                         rf"generation={generation}\b", srv.log())}
    return generation_pids(srv, generation) - exited


def control(srv, path):
    return json.loads(control_request(srv.state_dir, "GET", path)[1])


def wait_ready(srv, generation):
    """Every slot's current process is of `generation` and running."""
    def ready():
        st = control(srv, "/processes")
        return all(p["generation"] == generation and p["status"] == "running"
                   for p in st["processes"]) and st
    return poll(ready, 20, f"generation {generation} running", lambda: srv.log()[-3000:])


def reload(srv, generation):
    srv.signal(signal.SIGHUP)
    st = wait_ready(srv, generation)
    # ...and every process of the previous generation was told to drain (or, past the bound, to
    # close), or is gone.
    def told():
        told = {int(p) for p in re.findall(rf"process_(?:draining|closing|exited) slot=\d+ "
                                           rf"pid=(\d+) generation={generation - 1}\b",
                                           srv.log())}
        return generation_pids(srv, generation - 1) <= told
    poll(told, 10, f"generation {generation - 1} draining", lambda: srv.log()[-3000:])
    return st


def served_pid(srv):
    s = socket.create_connection((srv.host, srv.port), timeout=5)
    try:
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = read_to_eof(s, 5, reset_ok=False)
    finally:
        s.close()
    return int(re.search(rb"Corral-Process: slot=\d+ pid=(\d+)", data).group(1))


class Ws:
    """A raw WebSocket client on /ws/echo (served) or /counter/ws/echo (relayed)."""

    def __init__(self, srv, path):
        self.path = path
        self.s = socket.create_connection((srv.host, srv.port), timeout=10)
        srv.clients.append(self.s)
        self.s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nOrigin: http://localhost\r\n"
                       "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            b = self.s.recv(4096)
            assert b, head
            head += b
        assert head.startswith(b"HTTP/1.1 101"), head
        self.buf = head.split(b"\r\n\r\n", 1)[1]

    def send(self, opcode, payload):
        key = os.urandom(4)
        masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        self.s.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + key + masked)

    def _need(self, n):
        while len(self.buf) < n:
            b = self.s.recv(4096)
            if not b:
                return False
            self.buf += b
        return True

    def frame(self):
        """(opcode, payload), or None at EOF."""
        if not self._need(2):
            return None
        n = self.buf[1] & 0x7F
        assert n < 126, self.buf
        if not self._need(2 + n):
            return None
        op, payload = self.buf[0] & 0x0F, self.buf[2:2 + n]
        self.buf = self.buf[2 + n:]
        return op, payload

    def echo(self, text):
        self.send(0x1, text.encode())
        f = self.frame()
        assert f == (0x1, text.encode()), (self.path, f)

    def close_code(self):
        """The code of the server's close frame (answered), or None when the TCP is cut."""
        f = self.frame()
        while f is not None and f[0] != 0x8:
            f = self.frame()
        if f is None:
            return None
        self.send(0x8, f[1][:2])
        return int.from_bytes(f[1][:2], "big")


needs_worker = pytest.mark.skipif(not os.access(CPP_WORKER, os.X_OK),
                                  reason=f"{CPP_WORKER} is not built")


@needs_worker
def test_websockets_survive_repeated_reloads_and_the_bound_closes_the_oldest(server_factory,
                                                                            tmp_path):
    # close_ms bounds how long the oldest generation's relayed socket outlives its 1001.
    srv = start(server_factory, tmp_path, extra="[timeouts]\nclose_ms = 1000")
    sockets = {}  # generation -> (served, relayed)

    def open_pair(generation):
        served, relayed = Ws(srv, "/ws/echo"), Ws(srv, "/counter/ws/echo")
        served.echo(f"hello {generation}")
        relayed.echo(f"hello {generation}")
        sockets[generation] = (served, relayed)

    open_pair(1)
    for generation in (2, 3, 4):
        reload(srv, generation)
        # Every socket of every older generation still echoes after this reload.
        for g, (served, relayed) in sockets.items():
            served.echo(f"gen {g} after reload to {generation}")
            relayed.echo(f"gen {g} after reload to {generation}")
        # New connections are the newest generation's.
        assert served_pid(srv) in generation_pids(srv, generation)
        open_pair(generation)
    # A process with open sockets drains on (one without exits at once): each older generation
    # has one, listed by the control API (`corral ctl processes`).
    for g in (1, 2, 3):
        assert live(srv, g), (g, srv.log()[-3000:])
    draining = control(srv, "/processes")["draining"]
    assert sorted({d["generation"] for d in draining}) == [1, 2, 3], draining
    assert all(d["status"] == "draining" for d in draining), draining

    # A 4th reload: 4 older generations would drain, the bound is 3: generation 1 is closed.
    srv.signal(signal.SIGHUP)
    served1, relayed1 = sockets.pop(1)
    assert served1.close_code() == 1001
    assert relayed1.close_code() is None  # a relayed upgrade is a byte stream: it is cut
    poll(lambda: not live(srv, 1), 20, "generation 1 exits", lambda: srv.log()[-3000:])
    wait_ready(srv, 5)
    for g, (served, relayed) in sockets.items():
        served.echo(f"gen {g} after reload to 5")
        relayed.echo(f"gen {g} after reload to 5")
    assert served_pid(srv) in generation_pids(srv, 5)
    for g in (2, 3, 4):
        assert live(srv, g), (g, srv.log()[-3000:])
    assert "max_draining_generations" in srv.log() or "generation_index_reused" in srv.log()


@needs_worker
def test_socket_kept_past_drain_timeout_gets_1001_and_the_old_process_exits(server_factory,
                                                                           tmp_path):
    srv = start(server_factory, tmp_path, args=("--drain-timeout-ms", "1500"),
                extra="[timeouts]\nclose_ms = 1000")
    old = generation_pids(srv, 1)
    served, relayed = Ws(srv, "/ws/echo"), Ws(srv, "/counter/ws/echo")
    served.echo("before")
    relayed.echo("before")
    reload(srv, 2)
    served.echo("draining")  # kept while the drain lasts
    relayed.echo("draining")
    assert served.close_code() == 1001  # at drain_ms
    assert relayed.close_code() is None  # cut close_ms later
    poll(lambda: not live(srv, 1), 20, "generation 1 exits", lambda: srv.log()[-3000:])
    assert len(re.findall(r"process_exited slot=\d+ pid=\d+ generation=1 how=\"exit 0\"",
                          srv.log())) == PROCESSES, srv.log()[-3000:]
    assert served_pid(srv) not in old
    assert control(srv, "/processes")["draining"] == []
    fresh = Ws(srv, "/ws/echo")
    fresh.echo("new generation")


def test_drain_timeout_zero_closes_at_once(server_factory, tmp_path):
    """drain_ms = 0: a reload closes the old generation's WebSockets at once (the old rule)."""
    srv = server_factory("--processes", str(PROCESSES), "--state-dir", str(tmp_path / "state"),
                         binary=CORRAL_BIN, config="[timeouts]\ndrain_ms = 0\n")
    srv.state_dir = str(tmp_path / "state")
    wait_control_socket(srv.state_dir, 10, what="control socket")
    wait_ready(srv, 1)
    ws = Ws(srv, "/ws/echo")
    ws.echo("x")
    srv.signal(signal.SIGHUP)
    assert ws.close_code() == 1001


def test_check_validates_the_drain_keys(tmp_path):
    import subprocess
    cfg = tmp_path / "bad.toml"
    cfg.write_text("max_draining_generations = 4\n[timeouts]\ndrain_ms = -1\n")
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=ceiling(10))
    assert r.returncode == 78, r
    assert "max_draining_generations: 4 is out of range (0..3)" in r.stderr, r.stderr
    assert "timeouts.drain_ms: -1 is out of range" in r.stderr, r.stderr
