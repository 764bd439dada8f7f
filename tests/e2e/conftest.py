"""Fixtures for end-to-end tests: start the real binaries on free ports, stop them, bound time.

`server(...)` starts `corral_testsite` (or `corral` with binary="corral") with --listen 127.0.0.1:0,
reads the bound address from the "listening address=..." log line and yields a Server handle.
Every process is stopped (SIGTERM, then SIGKILL) when the test ends. The helpers that are not
fixtures (raw HTTP reads, polling, the control socket) live in corral_test_util.py.
"""
import os
import re
import resource
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from corral_test_util import CORRAL_BIN, ceiling, poll, read_response, recv_all

# The helpers most tests took from here before corral_test_util.py held them: still importable.
__all__ = ["CORRAL_BIN", "CORRAL_TESTSITE", "Server", "start_server", "poll", "read_response",
           "recv_all"]
CORRAL_TESTSITE = os.environ.get("CORRAL_TESTSITE", "build/debug/corral_testsite")


class Server:
    def __init__(self, proc, host, port, log_path):
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self.clients = []  # sockets from connect(), closed by stop()

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    def log(self):
        with open(self.log_path, "r", errors="replace") as f:
            return f.read()

    def wait_log(self, pattern, timeout=5.0):
        """Waits until the log matches `pattern` (a regex); returns the match."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log())
            if m:
                return m
            time.sleep(0.02)
        raise AssertionError(f"log never matched {pattern!r}:\n{self.log()[-3000:]}")

    def connect(self, timeout=5.0):
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.clients.append(s)
        return s

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=10.0):
        return self.proc.wait(timeout=timeout)

    def stop(self):
        # A failed assertion keeps its frame (and socket) alive, and a half-sent request would hold
        # a graceful shutdown for close_ms: close the test's client sockets first.
        for s in self.clients:
            s.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_server(args, binary=None, config=None, tmp_path=None, wait=True, env=None):
    binary = binary or CORRAL_TESTSITE
    tmp = tmp_path or tempfile.mkdtemp(prefix="corral-e2e-")
    cmd = [binary]
    if binary == CORRAL_BIN:
        cmd.append("serve")
    cmd += ["--listen", "127.0.0.1:0"]
    if config is not None:
        cfg = os.path.join(str(tmp), "corral.toml")
        with open(cfg, "w") as f:
            f.write(config)
        cmd += ["--config", cfg]
    cmd += list(args)
    log_path = os.path.join(str(tmp), f"server-{time.monotonic_ns()}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    srv = Server(proc, "127.0.0.1", None, log_path)
    if not wait:
        return srv
    deadline = time.monotonic() + ceiling(20)
    while time.monotonic() < deadline:
        m = re.search(r"listening address=([\d.]+):(\d+)", srv.log())
        if m:
            srv.port = int(m.group(2))
            return srv
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{srv.log()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("server did not start:\n" + srv.log())


@pytest.fixture
def server_factory(tmp_path):
    started = []

    def factory(*args, binary=None, config=None, wait=True, env=None):
        srv = start_server(args, binary=binary, config=config, tmp_path=tmp_path, wait=wait, env=env)
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture
def no_core_dumps():
    """For a test that aborts processes on purpose: no core files in the working tree."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


@pytest.fixture
def site(server_factory, tmp_path):
    """The test site with a static root holding a few files."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello file\n")
    (root / "index.html").write_text("<h1>index</h1>\n")
    (root / "big.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    sub = root / "sub"
    sub.mkdir()
    (sub / "index.html").write_text("<p>sub index</p>\n")
    return server_factory("--root", str(root))
