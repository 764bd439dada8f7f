#!/usr/bin/env python3
"""bench/workers_upload.py: proxied upload MiB/s per worker kind (issue 14), run by
bench/workers.sh's `upload` part (or alone).

  workers_upload.py --corral BIN --state DIR --kind NAME=CMD_JSON [--kind ...]
                    [--mib 1024] [--repeat 3] [--build corral]

One `corral serve` with every kind given ("NAME=["argv", ...]", routes /NAME/{id}/*,
max_body = "2G"); for each kind, after one unmeasured 64 MiB upload: --repeat uploads of --mib MiB
(made on the fly, 1 MiB blocks, never stored) to POST /NAME/x/count through the proxy, with
Content-Length and chunked, and the same with Content-Length straight to the worker's socket
(<state>/sockets/NAME%3Ax: the worker alone, no proxy). The time runs from the first byte sent to
the last byte of the answer ({"bytes": n}, checked). The server process's VmRSS is sampled every
20 ms during the proxied uploads: its peak growth is reported. Prints one line per measurement,
"upload KIND MODE MIB_PER_S RSS_GROWTH_KIB BUILD" (the best of --repeat), for workers.sh's report.
Only measures; nothing is pass/fail.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BLOCK = 1 << 20


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def read_answer(sock):
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = sock.recv(65536)
        if not b:
            raise ConnectionError("closed before the answer")
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        rest += sock.recv(65536)
    return head.split(b"\r\n")[0], rest[:length]


def upload(sock, path, size, chunked):
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\n{framing}\r\n\r\n".encode())
    block = memoryview(bytes(range(256)) * (BLOCK // 256))
    sent = 0
    while sent < size:
        n = min(BLOCK, size - sent)
        if chunked:
            sock.sendall(f"{n:x}\r\n".encode() + block[:n] + b"\r\n")
        else:
            sock.sendall(block[:n])
        sent += n
    if chunked:
        sock.sendall(b"0\r\n\r\n")
    status, body = read_answer(sock)
    if json.loads(body) != {"bytes": size}:
        raise AssertionError(f"{path}: {status!r} {body[:200]!r}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def server_pid(sup, binary):
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == sup and os.path.basename(argv0) == os.path.basename(binary).encode():
            return int(d)
    raise AssertionError("no server process")


def timed(connect, path, size, chunked, rss_pid=None):
    peak = [0]
    done = threading.Event()
    base = rss_kib(rss_pid) if rss_pid else 0

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss_kib(rss_pid) - base)

    t = threading.Thread(target=sample, daemon=True) if rss_pid else None
    if t:
        t.start()
    s = connect()
    t0 = time.monotonic()
    try:
        upload(s, path, size, chunked)
    finally:
        took = time.monotonic() - t0
        done.set()
        s.close()
        if t:
            t.join(5)
    return size / BLOCK / took, peak[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corral", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--kind", action="append", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build", default="corral")
    a = ap.parse_args()
    kinds = []
    config = ""
    for k in a.kind:
        name, _, cmd = k.partition("=")
        kinds.append(name)
        config += (f'[workers.{name}]\ncommand = {cmd}\nroutes = ["/{name}/{{id}}/*"]\n'
                   f'max_body = "2G"\nidle = "1h"\n')
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f'listen = "127.0.0.1:{port}"\naccess_log = false\nlog_level = "warn"\n'
              f'state_dir = "{a.state}"\n\n{config}')
    cfg.close()
    out = open(cfg.name + ".out", "w")
    proc = subprocess.Popen([a.corral, "serve", "--config", cfg.name], stdout=out, stderr=out)
    try:
        connect = lambda: socket.create_connection(("127.0.0.1", port), timeout=120)  # noqa: E731
        deadline = time.monotonic() + 20
        while True:
            try:
                connect().close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        srv = server_pid(proc.pid, a.corral)
        size = a.mib * BLOCK
        for name in kinds:
            timed(connect, f"/{name}/x/count", 64 * BLOCK, False)  # starts and warms the worker
            sock_path = os.path.join(a.state, "sockets", f"{name}%3Ax")

            def direct():
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(120)
                s.connect(sock_path)
                return s

            for mode, conn, chunked, rss in (("proxied-length", connect, False, srv),
                                             ("proxied-chunked", connect, True, srv),
                                             ("direct-length", direct, False, None)):
                best, grew = 0.0, 0
                for _ in range(a.repeat):
                    mibs, g = timed(conn, f"/{name}/x/count" if rss else "/count", size,
                                    chunked, rss)
                    best, grew = max(best, mibs), max(grew, g)
                print(f"upload {name} {mode} {best:.0f} {grew if rss else '-'} {a.build}",
                      flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(cfg.name)


if __name__ == "__main__":
    sys.exit(main())
