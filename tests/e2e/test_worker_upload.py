"""Request bodies streamed through the worker proxy (issue 14; docs/http.md "Streamed request
bodies", docs/worker-protocol.md).

A worker kind's routes stream the request body to the worker as it comes, with backpressure both
ways: a 1 GiB upload (made on the fly, never stored) with Content-Length and chunked goes through
the proxy to the example workers' `POST /count`, which counts it; the server process's RSS is
sampled meanwhile and must not grow by more than 32 MiB. A client that leaves mid-upload makes
the worker see its request cut (its route's body aborts: `GET /count/aborted`), and the server
serves on. `[workers.<kind>] max_body` is the kind's own limit: a Content-Length above it is 413
at once, a chunked body passing it is cut with 413 (and `corral check` judges its values). An
upload to an address whose worker is not running yet waits for it, then gets its 100 Continue.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import children_of, poll, read_response, rss_kib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
NODE_WORKER = os.path.join(REPO, "examples", "worker_node", "worker.mjs")
PYTHON = sys.executable or "/usr/bin/python3"
NODE = os.environ.get("CORRAL_NODE", "node")
SANITIZED = bool(os.environ.get("CORRAL_SANITIZED"))

GIB = 1 << 30
BLOCK = 1 << 20
# The bound the issue sets. Under AddressSanitizer freed buffers sit in its quarantine and its
# shadow memory grows with what is touched: allowed twice as much there (measured growth in either
# build is well under 1 MiB: the body passes through two 16-128 KiB buffers).
RSS_BOUND_MIB = 64 if SANITIZED else 32


def q(s):
    return json.dumps(s)


@pytest.fixture
def corral(server_factory, tmp_path):
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    config = f"""
[workers.cpp]
command = [{q(CPP_WORKER)}]
routes = ["/cpp/{{id}}/*"]
max_body = "2G"
[workers.py]
command = [{q(PYTHON)}, {q(PY_WORKER)}]
routes = ["/py/{{id}}/*"]
max_body = "2G"
[workers.node]
command = [{q(NODE)}, {q(NODE_WORKER)}]
routes = ["/node/{{id}}/*"]
max_body = "2G"
[workers.small]
command = [{q(CPP_WORKER)}]
routes = ["/small/{{id}}/*"]
max_body = "1M"
"""
    return server_factory("--state-dir", str(tmp_path / "state"), "--no-access-log",
                          binary=CORRAL_BIN, config=config)


def server_pids(srv):
    """The server processes: the supervisor's children running corral (not the workers)."""
    binary = os.path.basename(CORRAL_BIN).encode()
    return [p for p, cmd in children_of(srv.proc.pid).items()
            if os.path.basename(cmd.split(b"\0")[0]) == binary]


def request(srv, method, path, body=b"", timeout=30):
    s = srv.connect(timeout=timeout)
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    s.sendall(head + body)
    status, _, data, _ = read_response(s, timeout=timeout)
    s.close()
    return status, data


def upload(sock, path, size, chunked, stop_after=None):
    """Sends POST `path` with `size` bytes made on the fly (Content-Length or chunked, in 1 MiB
    blocks). `stop_after`: bytes after which it returns without finishing."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n\r\n".encode())
    block = memoryview(bytes(range(256)) * (BLOCK // 256))
    sent = 0
    while sent < size:
        n = min(BLOCK, size - sent)
        if chunked:
            sock.sendall(f"{n:x}\r\n".encode())
        sock.sendall(block[:n])
        if chunked:
            sock.sendall(b"\r\n")
        sent += n
        if stop_after is not None and sent >= stop_after:
            return sent
    if chunked:
        sock.sendall(b"0\r\n\r\n")
    return sent


class RssSampler:
    """Samples the VmRSS of `pids` every 20 ms in a thread until stop(); peak growth in KiB."""

    def __init__(self, pids):
        self.pids = pids
        self.base = {p: rss_kib(p) for p in pids}
        self.peak = dict(self.base)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(0.02):
            for p in self.pids:
                self.peak[p] = max(self.peak[p], rss_kib(p, missing=0))

    def stop(self):
        self.done.set()
        self.thread.join(5)
        return max(self.peak[p] - self.base[p] for p in self.pids)


def warm(srv, kind, key):
    """Starts the address's worker and waits for it to answer."""
    status, _ = request(srv, "GET", f"/{kind}/{key}/")
    assert status == 200, (status, srv.log()[-2000:])


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_gib_upload_streams_with_bounded_rss(corral, chunked):
    warm(corral, "cpp", "u1")
    pids = server_pids(corral)
    assert pids, children_of(corral.proc.pid)
    # A first upload warms the buffers every later one reuses.
    s = corral.connect(timeout=60)
    upload(s, "/cpp/u1/count", 8 * BLOCK, chunked)
    status, _, data, _ = read_response(s, timeout=60)
    assert json.loads(data) == {"bytes": 8 * BLOCK}, (status, data)
    sampler = RssSampler(pids)
    t0 = time.monotonic()
    try:
        upload(s, "/cpp/u1/count", GIB, chunked)
        status, _, data, _ = read_response(s, timeout=120)
    finally:
        grew = sampler.stop()
    took = time.monotonic() - t0
    print(f"1 GiB {'chunked' if chunked else 'Content-Length'}: {took:.2f} s, "
          f"{GIB / BLOCK / took:.0f} MiB/s, server RSS growth {grew} KiB")
    assert status == 200, (status, data, corral.log()[-2000:])
    assert json.loads(data) == {"bytes": GIB}
    assert grew < RSS_BOUND_MIB * 1024, f"server RSS grew {grew // 1024} MiB"
    # keep-alive: the same connection serves on
    s.sendall(b"GET /cpp/u1/count/aborted HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    status, _, data, _ = read_response(s, timeout=10)
    assert data == b"0\n", data


@pytest.mark.parametrize("kind", ["cpp", "py", "node"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_client_leaving_mid_upload_cuts_the_workers_request(corral, chunked, kind):
    if kind == "node" and os.system(f"{NODE} --version >/dev/null 2>&1") != 0:
        pytest.skip("no node")
    warm(corral, kind, "u2")
    s = socket.create_connection((corral.host, corral.port), timeout=30)
    upload(s, f"/{kind}/u2/count", GIB, chunked, stop_after=16 * BLOCK)
    s.close()  # mid-upload
    # The worker's route sees its body end early (the proxy closed its connection).
    poll(lambda: request(corral, "GET", f"/{kind}/u2/count/aborted")[1] == b"1\n", 20,
         "the worker's upload aborted", detail=lambda: corral.log()[-3000:])
    # The server serves on, the same address and its worker too, uploads included.
    status, data = request(corral, "POST", f"/{kind}/u2/count", b"x" * 100_000)
    assert json.loads(data) == {"bytes": 100_000}, (status, data)
    assert request(corral, "GET", f"/{kind}/u2/count/aborted")[1] == b"1\n"
    # No leak: the server stops cleanly (under ASan a leak fails its exit).
    corral.stop()
    assert corral.proc.returncode == 0, corral.log()[-3000:]
    assert "LeakSanitizer" not in corral.log()


def test_max_body_per_kind(corral):
    warm(corral, "small", "m1")
    # Content-Length over the kind's 1 MiB: 413 at once, before any body byte is sent.
    s = corral.connect(timeout=10)
    s.sendall(b"POST /small/m1/count HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Length: 2000000\r\n\r\n")
    status, _, _, _ = read_response(s, timeout=10)
    assert status == 413, status
    # Chunked past it: cut with 413 (nothing was answered yet).
    s = corral.connect(timeout=10)
    try:
        upload(s, "/small/m1/count", 2 * BLOCK, True)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close before it has read it all
    status, _, _, _ = read_response(s, timeout=10)
    assert status == 413, status
    # Under the limit it goes through; the cpp kind (2G) takes what the server's 8 MiB would not.
    status, data = request(corral, "POST", "/small/m1/count", b"y" * 500_000)
    assert json.loads(data) == {"bytes": 500_000}, (status, data)
    status, data = request(corral, "POST", "/cpp/m1/count", b"z" * (9 << 20), timeout=60)
    assert json.loads(data) == {"bytes": 9 << 20}, (status, data)


@pytest.mark.parametrize("kind", ["py", "node"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_other_workers_count_streamed_uploads(corral, kind, chunked):
    if kind == "node" and os.system(f"{NODE} --version >/dev/null 2>&1") != 0:
        pytest.skip("no node")
    warm(corral, kind, "o1")
    s = corral.connect(timeout=60)
    size = 64 * BLOCK + 123
    upload(s, f"/{kind}/o1/count", size, chunked)
    status, _, data, _ = read_response(s, timeout=60)
    assert status == 200, (status, data, corral.log()[-2000:])
    assert json.loads(data) == {"bytes": size}


@pytest.mark.parametrize("value,ok", [('"2G"', True), ("1048576", True), ('"64M"', True),
                                      ('"2X"', False), ('"2T"', False), ("-1", False),
                                      ("true", False)])
def test_max_body_config_values(tmp_path, value, ok):

    cfg = tmp_path / "corral.toml"
    cfg.write_text(f'[workers.k]\ncommand = [{q(CPP_WORKER)}]\nroutes = ["/k/{{id}}/*"]\n'
                   f"max_body = {value}\n")
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=30)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        assert r.returncode == 78, r.stdout + r.stderr
        assert "workers.k.max_body" in r.stdout + r.stderr


def test_an_upload_to_a_new_address_waits_for_its_worker_and_gets_its_100(corral):
    # The body is asked for once the worker is up and the proxy has its connection: then the
    # front's 100 Continue goes out, and the body streams.
    s = corral.connect(timeout=30)
    s.sendall(b"POST /cpp/fresh/count HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3000000\r\n"
              b"Expect: 100-continue\r\n\r\n")
    status, _, _, rest = read_response(s, timeout=30)
    assert status == 100 and rest == b"", status
    s.sendall(b"c" * 3_000_000)
    status, _, data, _ = read_response(s, timeout=30)
    assert status == 200 and json.loads(data) == {"bytes": 3_000_000}, (status, data)
