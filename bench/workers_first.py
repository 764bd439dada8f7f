#!/usr/bin/env python3
"""bench/workers_first.py: time first requests to new worker addresses (helper of workers.sh).

    workers_first.py --port P --prefix /counter/a --count 200 [--concurrency 8] [--start 1]
                     [--spares N --state-dir DIR]

Requests GET {prefix}{i}/ for i in start..start+count-1, each on a new TCP connection
(Connection: close), `concurrency` at a time (threads pulling from one counter). Each sample is the
wall time from before connect() to the last byte of the response (the server closes the
connection), so for an address nobody asked for before it covers: corral's routing, the resolve
message to the supervisor, fork + exec of the worker, its lock/started/ready, the proxied request
and the response. Prints one JSON object: count, errors, median/p90/p99/max/mean in ms.
Any status other than 200 is an error (and is printed on stderr, the first few).

With --spares N (a kind with `spares = N`, docs/process-model.md "Warm spares"), the requests go
in rounds of `concurrency` (at most N): before each round, GET /workers on the control socket
(DIR/control.sock) is polled until N spares are in standby, so every first request finds a warm
spare, as one that comes while the kind's spares are all waiting does. The wait is not timed.
"""

import argparse
import json
import math
import socket
import statistics
import sys
import threading
import time


def one(port, path):
    t0 = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", port))
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    finally:
        s.close()
    t1 = time.perf_counter()
    data = b"".join(chunks)
    status = data[9:12].decode(errors="replace") if data.startswith(b"HTTP/1.") else "???"
    return (t1 - t0) * 1000.0, status, data


def standby_spares(state_dir):
    """How many spares GET /workers lists in standby (the control socket, one request)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(10)
        s.connect(f"{state_dir}/control.sock")
        s.sendall(b"GET /workers HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    finally:
        s.close()
    body = data.partition(b"\r\n\r\n")[2]
    state = json.loads(body)
    return sum(1 for e in state.values() if e.get("spare") and e.get("status") == "standby")


def wait_spares(state_dir, n, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while standby_spares(state_dir) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"workers_first.py: {n} spares not in standby after {timeout_s} s")
        time.sleep(0.002)


def percentile(sorted_xs, q):
    # nearest-rank: the smallest sample with at least q of the samples at or below it
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, math.ceil(q * len(sorted_xs) - 1e-9) - 1))
    return sorted_xs[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--start", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--spares", type=int, default=0)
    ap.add_argument("--state-dir", default="")
    args = ap.parse_args()
    if args.spares:
        if not args.state_dir:
            ap.error("--spares needs --state-dir")
        args.concurrency = min(args.concurrency, args.spares)

    samples, errors = [], []
    lock = threading.Lock()
    nxt = [args.start]
    end = args.start + args.count

    def run():
        while True:
            with lock:
                i = nxt[0]
                if i >= end:
                    return
                nxt[0] += 1
            path = f"{args.prefix}{i}/"
            try:
                ms, status, data = one(args.port, path)
            except OSError as e:
                with lock:
                    errors.append(f"{path}: {e}")
                continue
            with lock:
                if status == "200":
                    samples.append(ms)
                else:
                    errors.append(f"{path}: status {status}: {data[:200]!r}")

    t0 = time.perf_counter()
    if args.spares:  # rounds, each once every spare is warm; the waits are left out of `wall`
        waited = 0.0
        while nxt[0] < end:
            w0 = time.perf_counter()
            wait_spares(args.state_dir, args.spares)
            waited += time.perf_counter() - w0
            last = min(end, nxt[0] + args.concurrency)
            round_end = [last]

            def run_round():
                while True:
                    with lock:
                        i = nxt[0]
                        if i >= round_end[0]:
                            return
                        nxt[0] += 1
                    path = f"{args.prefix}{i}/"
                    try:
                        ms, status, data = one(args.port, path)
                    except OSError as e:
                        with lock:
                            errors.append(f"{path}: {e}")
                        continue
                    with lock:
                        if status == "200":
                            samples.append(ms)
                        else:
                            errors.append(f"{path}: status {status}: {data[:200]!r}")

            threads = [threading.Thread(target=run_round) for _ in range(last - nxt[0])]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        wall = time.perf_counter() - t0 - waited
    else:
        threads = [threading.Thread(target=run) for _ in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0

    for e in errors[:5]:
        print(f"workers_first.py: {e}", file=sys.stderr)
    xs = sorted(samples)
    out = {
        "count": len(xs),
        "errors": len(errors),
        "concurrency": args.concurrency,
        "median_ms": round(statistics.median(xs), 2) if xs else None,
        "p90_ms": round(percentile(xs, 0.90), 2),
        "p99_ms": round(percentile(xs, 0.99), 2),
        "max_ms": round(xs[-1], 2) if xs else None,
        "min_ms": round(xs[0], 2) if xs else None,
        "mean_ms": round(statistics.fmean(xs), 2) if xs else None,
        "starts_per_s": round(len(xs) / wall, 1) if wall > 0 else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
