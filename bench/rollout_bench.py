#!/usr/bin/python3
"""The rollout benchmark's driver (issue 13; run it through bench/rollout.sh).

    bench/rollout_bench.py --corral PATH --command JSON [--workers 100] [--mode in-place|restart]
                           [--rollouts 10] [--rate 400] [--connections 8] [--baseline-s 10]
                           [--gap-s 0.5] [--label NAME]

Runs `corral serve --config <tmp>/corral.toml` with one worker kind `b` (the `--command` argv,
e.g. '["build/release/examples/worker_cpp/example_worker"]', on "/b/{id}/*", idle 1 h, `code` a
directory holding hello.txt, `reload` = --mode), starts --workers addresses (/b/n0/ ... through
GET /code) and checks each answers, then:

  1. baseline: a steady load for --baseline-s seconds without rollouts: --connections threads,
     each with one keep-alive connection, sending GET /b/<n>/code over every address in turn at
     --rate requests/s in all (a fixed schedule: each request has its planned send time, and its
     latency is measured from then to the last byte read, so a stall delays and counts every
     request planned behind it: no coordinated omission);
  2. during: the same load while --rollouts rollouts run back to back (hello.txt alternating two
     contents, then `corral ctl rollout b --json`, --gap-s seconds apart); per rollout the time
     from spawning ctl to its exit and the report's took_ms.

Prints one JSON object: {label, mode, workers, rollouts: {ctl_ms: [...], took_ms: [...], median
and max of each}, latency_ms: {baseline: {p50, p99, max, n}, during: {...}}, failed requests, a
report that failed}. Nothing is pass/fail: the caller records the numbers. Progress lines go to
stderr.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def say(msg):
    sys.stderr.write(f"rollout_bench: {msg}\n")
    sys.stderr.flush()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * p / 100))]


def summary(values):
    return {"n": len(values), "p50": round(pct(values, 50), 2) if values else None,
            "p99": round(pct(values, 99), 2) if values else None,
            "max": round(max(values), 2) if values else None}


class Load:
    """Paced keep-alive GETs; records (planned send, latency ms) or failures."""

    def __init__(self, port, paths, connections, rate):
        self.port, self.paths = port, paths
        self.connections = connections
        self.period = connections / rate  # per thread
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.samples = []  # (planned, latency_ms)
        self.failures = []
        self.threads = []

    def start(self):
        t0 = time.monotonic()
        for i in range(self.connections):
            t = threading.Thread(target=self.run, args=(i, t0 + i * self.period / self.connections),
                                 daemon=True)
            t.start()
            self.threads.append(t)

    def run(self, i, first):
        mine = self.paths[i::self.connections] or self.paths
        conn = None
        n = 0
        planned = first
        samples, failures = [], []
        while not self.stop_flag.is_set():
            now = time.monotonic()
            if planned > now:
                if self.stop_flag.wait(planned - now):
                    break
            path = mine[n % len(mine)]
            n += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", path)
                r = conn.getresponse()
                r.read()
                done = time.monotonic()
                if r.status != 200:
                    failures.append((path, f"status {r.status}"))
                else:
                    samples.append((planned, (done - planned) * 1000))
            except Exception as e:  # noqa: BLE001 - counted
                failures.append((path, repr(e)))
                if conn is not None:
                    conn.close()
                conn = None
            planned += self.period
        if conn is not None:
            conn.close()
        with self.lock:
            self.samples += samples
            self.failures += failures

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corral", required=True)
    ap.add_argument("--command", required=True, help="the worker's argv as a JSON list")
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--mode", default="in-place", choices=["in-place", "restart", "auto"])
    ap.add_argument("--rollouts", type=int, default=10)
    ap.add_argument("--rate", type=float, default=400)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--baseline-s", type=float, default=10)
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="corral-rollout-bench.")
    code = os.path.join(tmp, "code")
    os.makedirs(code)
    hello = os.path.join(code, "hello.txt")
    with open(hello, "w") as f:
        f.write("A")
    state = os.path.join(tmp, "state")
    port = free_port()
    config = os.path.join(tmp, "corral.toml")
    with open(config, "w") as f:
        f.write(f'listen = "127.0.0.1:{port}"\naccess_log = false\nlog_level = "warn"\n'
                f'state_dir = "{state}"\n\n'
                f"[workers.b]\ncommand = {json.dumps(json.loads(args.command))}\n"
                f'routes = ["/b/{{id}}/*"]\nidle = "1h"\ncode = "code"\n'
                f'reload = "{args.mode}"\n')
    out = open(os.path.join(tmp, "corral.out"), "w")
    proc = subprocess.Popen([args.corral, "serve", "--config", config], stdout=out, stderr=out,
                            stdin=subprocess.DEVNULL)
    result = {"label": args.label, "mode": args.mode, "workers": args.workers}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                if os.path.exists(os.path.join(state, "control.sock")):
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"corral did not start:\n{open(out.name).read()}")
            time.sleep(0.05)
        paths = [f"/b/n{i}/code" for i in range(args.workers)]

        def first(path):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("GET", path)
            r = c.getresponse()
            body = r.read()
            c.close()
            if r.status != 200 or json.loads(body).get("hello") != "A":
                raise SystemExit(f"GET {path}: {r.status} {body[:200]!r}")

        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(first, paths))
        say(f"{args.label} {args.mode}: {args.workers} workers started in "
            f"{time.monotonic() - t:.1f} s")

        say(f"{args.label} {args.mode}: baseline load, {args.baseline_s:.0f} s at "
            f"{args.rate:.0f} req/s")
        load = Load(port, paths, args.connections, args.rate)
        load.start()
        time.sleep(args.baseline_s)
        load.stop()
        base, base_failed = [s[1] for s in load.samples], load.failures

        say(f"{args.label} {args.mode}: {args.rollouts} rollouts under the same load")
        load = Load(port, paths, args.connections, args.rate)
        load.start()
        time.sleep(0.5)
        ctl_ms, took_ms, bad_reports = [], [], []
        windows = []
        for i in range(args.rollouts):
            with open(hello + ".tmp", "w") as f:
                f.write("B" if i % 2 == 0 else "A")
            os.rename(hello + ".tmp", hello)
            t = time.monotonic()
            r = subprocess.run([args.corral, "ctl", "rollout", "b", "--json", "--state-dir", state],
                               capture_output=True, text=True, timeout=300)
            end = time.monotonic()
            windows.append((t, end))
            ctl_ms.append(round((end - t) * 1000, 1))
            try:
                report = json.loads(r.stdout)
                took_ms.append(report["took_ms"])
                if r.returncode != 0 or report.get("failed"):
                    bad_reports.append(report)
            except (ValueError, KeyError):
                bad_reports.append({"rc": r.returncode, "stdout": r.stdout[:500],
                                    "stderr": r.stderr[:500]})
            say(f"  rollout {i + 1}/{args.rollouts}: ctl {ctl_ms[-1]:.0f} ms, took_ms "
                f"{took_ms[-1] if took_ms else '?'}")
            time.sleep(args.gap_s)
        load.stop()
        # latency of the requests planned inside a rollout's window, and of all of phase 2
        inside = [lat for planned, lat in load.samples
                  if any(a <= planned <= b for a, b in windows)]
        result.update({
            "rollouts": {"ctl_ms": ctl_ms, "took_ms": took_ms,
                         "ctl_median_ms": pct(ctl_ms, 50), "ctl_max_ms": max(ctl_ms),
                         "took_median_ms": pct(took_ms, 50) if took_ms else None,
                         "took_max_ms": max(took_ms) if took_ms else None},
            "rate": args.rate, "connections": args.connections,
            "latency_ms": {"baseline": summary(base),
                           "during_rollouts": summary(inside),
                           "phase": summary([s[1] for s in load.samples])},
            "failed_requests": {"baseline": len(base_failed), "during": len(load.failures),
                                "first": (base_failed + load.failures)[:3]},
            "bad_reports": bad_reports[:3],
            "load1": float(open("/proc/loadavg").read().split()[0]),
        })
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
