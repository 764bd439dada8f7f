#!/usr/bin/python3
"""A burst of distinct worker addresses against `corral serve` (issue 11 #5): how many processes,
how much memory and how much load it costs, and whether the machine stays responsive.

    bench/worker_burst.py [--corral build/release/corral] [--addresses 2000] [--threads 64]
                          [--prefix /note/m] [-- extra corral serve arguments]

Runs `corral serve --listen 127.0.0.1:0 --state-dir <tmp>` (otherwise the defaults: the embedded
site and its notes demo, the default worker bounds) in a scratch directory, then GETs
`<prefix>N/` for N in 0..addresses-1 from `--threads` keep-alive connections at once, as fast as
they are answered. Meanwhile, every 50 ms, it samples the supervisor's descendants (count, summed
RSS from /proc/PID/statm, how many run or wait in D state, PSS from smaps_rollup once a second),
MemAvailable and the 1-minute load average, and every 100 ms runs
`curl -o /dev/null -w %{time_total} http://ADDR/hello` (a new process and a new connection: what
a user of the machine would see). Prints one JSON object with the results, then stops corral
(SIGTERM) and reports how long the stop took.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def rss(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def cpu_s(pid):
    """utime + stime of `pid` and its reaped children, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in v[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corral", default="build/release/corral")
    ap.add_argument("--addresses", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--prefix", default="/note/m")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    corral = os.path.abspath(a.corral)
    work = tempfile.mkdtemp(prefix="corral-burst-")
    log_path = os.path.join(work, "corral.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([corral, "serve", "--listen", "127.0.0.1:0", "--state-dir",
                             os.path.join(work, "state"), *a.extra],
                            cwd=work, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    port = None
    while time.monotonic() < deadline and port is None:
        with open(log_path) as f:
            m = re.search(r"listening address=[\d.]+:(\d+)", f.read())
        if m:
            port = int(m.group(1))
        elif proc.poll() is not None:
            sys.exit(f"corral exited: {open(log_path).read()}")
        else:
            time.sleep(0.05)
    host = f"127.0.0.1:{port}"
    time.sleep(0.5)  # the supervisor and its server process settle

    stop = threading.Event()
    samples = {"procs": 0, "rss": 0, "load1": 0.0, "rd": 0, "rd_sum": 0, "n": 0, "pss": 0,
               "mem_drop": 0}
    mem0 = mem_available()
    base = {"procs": len(descendants(proc.pid)), "rss": rss(proc.pid) +
            sum(rss(p) for p in descendants(proc.pid))}

    def sample():
        last_pss = 0.0
        while not stop.is_set():
            kids = descendants(proc.pid)
            samples["procs"] = max(samples["procs"], len(kids))
            samples["rss"] = max(samples["rss"], rss(proc.pid) + sum(rss(p) for p in kids))
            # corral's own share of the load average: its processes running or in D state
            rd = sum(proc_state(p) in ("R", "D") for p in [proc.pid, *kids])
            samples["rd"] = max(samples["rd"], rd)
            samples["rd_sum"] += rd
            samples["n"] += 1
            samples["mem_drop"] = max(samples["mem_drop"], mem0 - mem_available())
            if time.monotonic() - last_pss >= 1.0:
                last_pss = time.monotonic()
                samples["pss"] = max(samples["pss"], pss(proc.pid) + sum(pss(p) for p in kids))
            with open("/proc/loadavg") as f:
                samples["load1"] = max(samples["load1"], float(f.read().split()[0]))
            stop.wait(0.05)

    hello = []
    hello_failed = []

    def probe():
        while not stop.is_set():
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", "30", "-w",
                                "%{http_code} %{time_total}", f"http://{host}/hello"],
                               capture_output=True, text=True)
            code, _, t = r.stdout.partition(" ")
            if code == "200":
                hello.append(float(t))
            else:
                hello_failed.append(r.stdout or r.stderr)
            stop.wait(0.1)

    statuses = {}
    lock = threading.Lock()

    def burst(k):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for i in range(k, a.addresses, a.threads):
            try:
                conn.request("GET", f"{a.prefix}{i}/")
                r = conn.getresponse()
                r.read()
                key = str(r.status) + ("+retry-after" if r.getheader("Retry-After") else "")
            except Exception as e:  # noqa: BLE001 - counted
                key = type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            with lock:
                statuses[key] = statuses.get(key, 0) + 1
        conn.close()

    threads = [threading.Thread(target=sample), threading.Thread(target=probe)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # a few unloaded /hello probes first
    unloaded = list(hello)
    with open("/proc/loadavg") as f:
        load_before = float(f.read().split()[0])
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(a.threads) as ex:
        list(ex.map(burst, range(a.threads)))
    elapsed = time.monotonic() - t0
    time.sleep(1.0)  # the tail of the burst (stops, exits) while still sampling
    stop.set()
    for t in threads:
        t.join()
    with open(log_path) as f:
        text = f.read()
    state = subprocess.run([corral, "ctl", "workers", "--json", "--state-dir", os.path.join(work, "state")],
                           capture_output=True, text=True, timeout=30).stdout
    try:
        entries = json.loads(state)
    except ValueError:
        entries = {}
    supervisor_cpu = cpu_s(proc.pid)
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "killed"
    result = {
        "addresses": a.addresses, "threads": a.threads, "burst_s": round(elapsed, 2),
        "statuses": statuses,
        "processes_before": base["procs"], "processes_peak": samples["procs"],
        "rss_before_mb": round(base["rss"] / 2**20, 1),
        "rss_peak_mb": round(samples["rss"] / 2**20, 1),
        "pss_peak_mb": round(samples["pss"] / 2**20, 1),
        "memavailable_drop_peak_mb": round(samples["mem_drop"] / 2**20, 1),
        "load1_before": load_before, "load1_peak": samples["load1"],
        "corral_running_or_d_peak": samples["rd"],
        "corral_running_or_d_mean": round(samples["rd_sum"] / max(1, samples["n"]), 1),
        "supervisor_and_reaped_cpu_s": round(supervisor_cpu, 1),
        "hello_unloaded_ms": [round(x * 1000, 1) for x in unloaded],
        "hello_during": {"n": len(hello) - len(unloaded),
                         "p50_ms": round(1000 * (percentile(hello[len(unloaded):], 0.5) or 0), 1),
                         "p99_ms": round(1000 * (percentile(hello[len(unloaded):], 0.99) or 0), 1),
                         "max_ms": round(1000 * max(hello[len(unloaded):] or [0]), 1),
                         "failed": len(hello_failed)},
        "workers_after": len(entries),
        "log": {k: text.count(k + " ") for k in
                ("worker_starting", "worker_evicted", "worker_limit", "worker_failed")},
        "bounds": (re.search(r"workers_bounds [^\n]*", text) or [None])[0],
        "sigterm_exit": code, "stop_s": round(time.monotonic() - t1, 2),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
