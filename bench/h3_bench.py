#!/usr/bin/python3
"""HTTP/3 client side of bench/h3.sh: handshakes per second and one large download, with
gtlsclient (Debian's ngtcp2-client), against whatever server listens on PORT.

  h3_bench.py handshakes PORT PATH TOTAL CONCURRENCY   -> prints "handshakes_per_s=<x> ok=<n>"
  h3_bench.py download PORT PATH BYTES                 -> prints "mib_per_s=<x> bytes=<n>"

A handshake here is a whole gtlsclient run: process start, QUIC + TLS 1.3 handshake, one small
request, close. The process cost is the same for every server, so the ratio is what to read.
Nothing here is pass/fail.
"""
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time

GTLSCLIENT = "/usr/bin/gtlsclient"


def one(port, path):
    dl = tempfile.mkdtemp(prefix="h3b-")
    subprocess.run([GTLSCLIENT, "-q", "--exit-on-all-streams-close", f"--download={dl}",
                        "--timeout=5s", "127.0.0.1", str(port), f"https://localhost:{port}{path}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    name = os.path.join(dl, os.path.basename(path) or "index.html")
    ok = os.path.exists(name)
    if ok:
        os.unlink(name)
    os.rmdir(dl)
    return ok


def handshakes(port, path, total, concurrency):
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda i: one(port, path), range(total)))
    elapsed = time.monotonic() - start
    ok = sum(results)
    print(f"handshakes_per_s={ok / elapsed:.1f} ok={ok} total={total} seconds={elapsed:.2f}")


def download(port, path, expected):
    dl = tempfile.mkdtemp(prefix="h3b-")
    start = time.monotonic()
    subprocess.run([GTLSCLIENT, "-q", "--exit-on-all-streams-close", f"--download={dl}",
                    "--timeout=10s", "--max-window=64M", "--max-stream-window=64M",
                    "127.0.0.1", str(port), f"https://localhost:{port}{path}"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    elapsed = time.monotonic() - start
    name = os.path.join(dl, os.path.basename(path))
    got = os.path.getsize(name) if os.path.exists(name) else 0
    if got:
        os.unlink(name)
    rate = got / elapsed / (1 << 20)
    print(f"mib_per_s={rate:.1f} bytes={got} expected={expected} seconds={elapsed:.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "handshakes":
        handshakes(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "download":
        download(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
