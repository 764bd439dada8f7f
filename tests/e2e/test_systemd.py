"""corral under systemd, with the test playing systemd (docs/operate.md, "systemd").

* NOTIFY_SOCKET: the test binds a Unix datagram socket (an abstract "@" name, as systemd's own)
  and reads what corral sends across serve -> SIGHUP -> SIGTERM: READY=1, RELOADING=1 with
  MONOTONIC_USEC, READY=1, STOPPING=1 in that order, STATUS= lines and WATCHDOG=1 pings, every
  datagram from the main process (what NotifyAccess=main accepts), under a supervisor and in a
  single process.
* LISTEN_FDS: the test binds and listens, then starts corral with the socket at fd 3 and
  LISTEN_PID set to corral's own pid (a Python wrapper that moves the socket to fd 3, sets
  LISTEN_PID to its pid and execs corral, which keeps that pid); corral
  serves on that very socket (every server process holds its inode) and binds nothing itself.
"""
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, children_of, free_port, http_get, poll


class NotifySocket:
    """systemd's side of sd_notify: a datagram socket that receives corral's messages with the
    sender's pid (SO_PASSCRED)."""

    def __init__(self):
        self.name = f"@corral-test-notify-{os.getpid()}-{time.monotonic_ns()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (pid, text)

    def read(self, timeout):
        self.sock.settimeout(timeout)
        try:
            data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return None
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        self.messages.append((pid, data.decode()))
        return data.decode()

    def wait_for(self, pattern, timeout):
        """Reads until a message matches `pattern`; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.read(max(0.01, deadline - time.monotonic()))
            if m is not None and re.search(pattern, m):
                return m
        raise AssertionError(f"no notification matching {pattern!r}; got {self.messages}")

    def states(self):
        """The lifecycle messages in order (STATUS and WATCHDOG left out)."""
        out = []
        for _, m in self.messages:
            first = m.split("\n")[0]
            if first in ("READY=1", "RELOADING=1", "STOPPING=1"):
                out.append(first)
        return out

    def close(self):
        self.sock.close()


@pytest.fixture
def notify():
    n = NotifySocket()
    yield n
    n.close()


@pytest.fixture
def state_dir():
    d = tempfile.mkdtemp(prefix="corral-sd-")  # short: Unix socket paths hold 107 bytes
    os.chmod(d, 0o700)
    yield d
    subprocess.run(["rm", "-rf", d], check=False)


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def spawn(procs, argv, env=None, pass_fds=(), log_path=None):
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                         env={**os.environ, **(env or {})}, pass_fds=pass_fds)
    procs.append(p)
    return p


def read_log(path):
    with open(path, errors="replace") as f:
        return f.read()


@pytest.mark.parametrize("mode", ["supervised", "single"])
def test_notify_ready_reloading_ready_stopping(notify, state_dir, procs, mode):
    port = free_port()
    log_path = os.path.join(state_dir, "corral.log")
    root = os.path.join(state_dir, "www")
    os.mkdir(root)
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write("hello\n")
    argv = [CORRAL_BIN, "serve", root, "--listen", f"127.0.0.1:{port}", "--state-dir", state_dir,
            "--no-access-log"]
    argv += ["--processes", "2"] if mode == "supervised" else []
    # WATCHDOG_USEC of 0.4 s: a ping every 0.2 s, so one comes within the test.
    env = {"NOTIFY_SOCKET": notify.name, "WATCHDOG_USEC": "400000"}
    p = spawn(procs, argv, env=env, log_path=log_path)

    notify.wait_for(r"^READY=1$", ceiling(20))
    # READY means every process accepts: the port answers at once.
    assert http_get("127.0.0.1", port, "/index.html")[0] == 200
    if mode == "supervised":
        assert len(re.findall(r"process_started", read_log(log_path))) == 2

    before_us = time.monotonic_ns() // 1000
    p.send_signal(signal.SIGHUP)
    reloading = notify.wait_for(r"^RELOADING=1", ceiling(10))
    after_us = time.monotonic_ns() // 1000
    # MONOTONIC_USEC is CLOCK_MONOTONIC (Python's monotonic clock on Linux) when the reload began.
    usec = int(re.search(r"\nMONOTONIC_USEC=(\d+)$", reloading).group(1))
    assert before_us <= usec <= after_us
    notify.wait_for(r"^READY=1$", ceiling(20))
    if mode == "supervised":
        # READY again only once the new generation's processes both serve.
        log = read_log(log_path)
        assert len(re.findall(r"process_started .*generation=2", log)) == 2, log
        assert http_get("127.0.0.1", port, "/index.html")[0] == 200

    p.send_signal(signal.SIGTERM)
    notify.wait_for(r"^STOPPING=1$", ceiling(10))
    assert p.wait(timeout=ceiling(20)) == 0
    while notify.read(0.05) is not None:  # what is left (a last STATUS)
        pass

    assert notify.states() == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"], notify.messages
    texts = [m for _, m in notify.messages]
    assert "WATCHDOG=1" in texts
    statuses = [m for m in texts if m.startswith("STATUS=")]
    assert statuses, texts
    if mode == "supervised":
        assert any(re.match(r"STATUS=generation \d+: 2/2 processes running", s) for s in statuses)
    # Only the main process notifies (NotifyAccess=main): the server processes were not told.
    assert {pid for pid, _ in notify.messages} == {p.pid}, notify.messages


def activated(procs, sock, argv, names=None, log_path=None):
    """corral started as systemd starts a socket-activated service: `sock` at fd 3, LISTEN_FDS=1,
    LISTEN_PID its own pid (the wrapper's, which exec keeps)."""
    n = sock.fileno()
    env = {"LISTEN_FDS": "1"}
    if names:
        env["LISTEN_FDNAMES"] = names
    script = ("import os, sys\n"
              f"os.dup2({n}, 3)\n"
              f"os.close({n})\n"
              "os.environ['LISTEN_PID'] = str(os.getpid())\n"
              "os.execv(sys.argv[1], sys.argv[1:])\n")
    return spawn(procs, [sys.executable, "-c", script, *argv], env=env, pass_fds=(n,),
                 log_path=log_path)


def socket_inodes(pid):
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    except FileNotFoundError:
        pass
    return out


def listening_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    return s


@pytest.mark.parametrize("mode", ["supervised-by-name", "single-by-address"])
def test_listen_fds_are_served(state_dir, procs, mode):
    sock = listening_socket()
    port = sock.getsockname()[1]
    inode = os.fstat(sock.fileno()).st_ino
    log_path = os.path.join(state_dir, "corral.log")
    if mode == "supervised-by-name":
        # Named "http": the `listen` address's socket, whatever the configured address says.
        elsewhere = free_port()
        argv = [CORRAL_BIN, "serve", "--listen", f"127.0.0.1:{elsewhere}", "--processes", "2",
                "--state-dir", state_dir, "--no-access-log"]
        p = activated(procs, sock, argv, names="http", log_path=log_path)
    else:
        # No name: matched by the address it is bound to.
        elsewhere = None
        argv = [CORRAL_BIN, "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", state_dir,
                "--no-access-log"]
        p = activated(procs, sock, argv, log_path=log_path)
    sock.close()  # corral holds it now (as systemd would keep its own copy; see below)

    poll(lambda: f"listening address=127.0.0.1:{port}" in read_log(log_path) or p.poll() is not None,
         ceiling(20), "listening", detail=lambda: read_log(log_path))
    assert p.poll() is None, read_log(log_path)
    status, body = poll(lambda: http_get("127.0.0.1", port, "/hello"), ceiling(10), "an answer")
    assert status == 200 and body == b"hello", (status, body)
    if mode == "supervised-by-name":
        servers = poll(lambda: [c for c in children_of(p.pid) if inode in socket_inodes(c)]
                       if len(children_of(p.pid)) >= 2 else None, ceiling(10), "two processes")
        assert len(servers) == 2, "every server process accepts from the passed socket"
        # The configured address was not bound: the passed socket replaced it.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", elsewhere), timeout=2).close()
    else:
        assert inode in socket_inodes(p.pid)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=ceiling(20)) == 0


def test_a_passed_socket_that_matches_nothing_stops_the_start(state_dir, procs):
    sock = listening_socket()
    argv = [CORRAL_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", state_dir]
    log_path = os.path.join(state_dir, "corral.log")
    p = activated(procs, sock, argv, names="admin-panel", log_path=log_path)
    sock.close()
    assert p.wait(timeout=ceiling(20)) == 78
    out = read_log(log_path)
    assert 'corral: socket activation: socket 3 (named "admin-panel")' in out, out
    assert "matches no listen address" in out, out
