#!/usr/bin/env python3
"""bench/status_page.py: what the status page costs the supervisor with many addresses.

    status_page.py --corral build/release/corral [--addresses 10000] [--seconds 20] [--clients 1]
                   [--churn 10]

Starts a corral (supervisor, one server process, an admin listener) with a worker kind whose
command is /bin/false, so every address asked for ends `failed` and stays listed (a failure is
sticky until retried): --addresses first requests leave that many addresses in the manager. Then,
while new addresses keep failing at --churn a second (so the page has changes to push), it reads
the supervisor's CPU time (utime + stime from /proc/PID/stat) over two windows of --seconds each:
first with nobody watching, then with --clients status pages open (each an EventSource stream,
GET /events on the admin listener, read as a browser does; the page's drawing costs the browser,
not the supervisor). Prints one JSON object: the CPU share of one core in each window, their
difference (what the open page costs), and how many view events the clients received.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def get(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        return data[9:12].decode(errors="replace")
    finally:
        s.close()


def populate(port, first, count, threads=16):
    """Asks for addresses first..first+count-1 once each; returns how many were answered."""
    lock = threading.Lock()
    state = {"next": first, "done": 0}

    def run():
        while True:
            with lock:
                i = state["next"]
                if i >= first + count:
                    return
                state["next"] += 1
            get(port, f"/f/{i}/")
            with lock:
                state["done"] += 1
                if state["done"] % 1000 == 0:
                    print(f"status_page: {state['done']} addresses", file=sys.stderr, flush=True)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return state["done"]


class Page:
    """One open status page: an EventSource stream, read until stopped; counts view events."""

    def __init__(self, port):
        self.views = 0
        self.bytes = 0
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                          "Accept: text/event-stream\r\n\r\n".encode())
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        try:
            while True:
                b = self.sock.recv(1 << 20)
                if not b:
                    return
                self.bytes += len(b)
                self.views += b.count(b"event: view")
        except OSError:
            return

    def close(self):
        self.sock.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corral", required=True)
    ap.add_argument("--addresses", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--churn", type=float, default=10, help="new failing addresses a second")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="corral-status-bench-")
    port, admin = free_port(), free_port()
    cfg = os.path.join(tmp, "corral.toml")
    with open(cfg, "w") as f:
        f.write(f"""listen = "127.0.0.1:{port}"
access_log = false
log_level = "warn"
[admin]
listen = "127.0.0.1:{admin}"
[workers]
max_starting = 64
max_workers = 1000
[workers.f]
command = ["/bin/false"]
routes = ["/f/{{id}}/*"]
""")
    log = open(os.path.join(tmp, "corral.log"), "w")
    proc = subprocess.Popen([a.corral, "serve", "--config", cfg, "--state-dir", os.path.join(tmp, "state")],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(admin, "/readyz") == "200":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"status_page: corral did not become ready (log: {log.name})")
            time.sleep(0.05)
        t0 = time.monotonic()
        done = populate(port, 0, a.addresses)
        print(f"status_page: {done} addresses in {time.monotonic() - t0:.1f} s", file=sys.stderr)

        stop = threading.Event()
        churned = [a.addresses]

        def churn():
            period = 1.0 / a.churn
            nxt = time.monotonic()
            while not stop.is_set():
                get(port, f"/f/{churned[0]}/")
                churned[0] += 1
                nxt += period
                stop.wait(max(0.0, nxt - time.monotonic()))

        ct = threading.Thread(target=churn, daemon=True)
        ct.start()
        time.sleep(1)  # the churn settles (a benchmark, not a test)

        def window():
            c0, w0 = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(a.seconds)
            return (cpu_seconds(proc.pid) - c0) / (time.monotonic() - w0)

        idle = window()
        pages = [Page(admin) for _ in range(a.clients)]
        time.sleep(1)
        watched = window()
        views = sum(p.views for p in pages)
        received = sum(p.bytes for p in pages)
        for p in pages:
            p.close()
        stop.set()
        ct.join()
        print(json.dumps({
            "addresses": churned[0], "clients": a.clients, "churn_per_s": a.churn,
            "supervisor_cpu_unwatched": round(idle, 4), "supervisor_cpu_watched": round(watched, 4),
            "page_cost_cpu": round(watched - idle, 4), "views": views, "bytes": received,
        }))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    main()
