"""HTTP/3 test helpers: start `corral serve` with TLS + HTTP/3, run gtlsclient (Debian's
ngtcp2-client) and read which server process answered each request.

gtlsclient does not verify certificates and exits 0 on many failures, so a fetch counts as good only
when every request's response head (":status: 200") and the `Corral-Process` header were seen.
"""
import concurrent.futures
import json
import re
import shutil
import subprocess
import tempfile
import time

from conftest import CORRAL_BIN
from corral_test_util import ceiling, free_port

GTLSCLIENT = shutil.which("gtlsclient") or "/usr/bin/gtlsclient"


def h3_config(port, steering="forward", retry="off", extra="", state_dir=None):
    state = f'state_dir = "{state_dir}"' if state_dir else ""
    return f"""
process_header = true
{state}

[tls]
listen = "127.0.0.1:{port}"

[http3]
steering = "{steering}"
retry = "{retry}"
{extra}
"""


def start_h3(server_factory, processes, steering="forward", retry="off", extra="", args=()):
    port = free_port()
    state_dir = tempfile.mkdtemp(prefix="corral-h3-state-")
    srv = server_factory("--processes", str(processes), *args, binary=CORRAL_BIN,
                         config=h3_config(port, steering, retry, extra, state_dir))
    srv.tls_port = port
    srv.state_dir = state_dir
    srv.wait_log(r"http3_listening", timeout=10)
    # Every process serving HTTP/3 (the supervisor logs http3_listening before it forks).
    deadline = time.monotonic() + 20
    while len(re.findall(r"quic_listening slot=", srv.log())) < processes:
        assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log()[-3000:]
        time.sleep(0.02)
    return srv


class Fetch:
    def __init__(self, ok, processes, statuses, output, reset):
        self.ok = ok
        self.processes = processes  # the Corral-Process values seen, in order
        self.statuses = statuses
        self.output = output
        self.reset = reset  # a stateless reset was received

    def __repr__(self):
        return f"Fetch(ok={self.ok}, processes={self.processes}, statuses={self.statuses})"


PROCESS_RE = re.compile(r"\[corral-process: ([^\]]+)\]")
STATUS_RE = re.compile(r"stream 0x[0-9a-f]+ \[:status: (\d+)\]")


def h3_fetch(port, path="/hello", requests=3, extra=(), timeout=15, host="localhost"):
    """One gtlsclient connection making `requests` requests for `path`."""
    with tempfile.TemporaryDirectory(prefix="corral-h3-") as dl:
        cmd = [GTLSCLIENT, "--exit-on-all-streams-close", "--no-http-dump", f"--download={dl}",
               "-n", str(requests), "--timeout=5s", *extra, "127.0.0.1", str(port),
               f"https://{host}:{port}{path}"]
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
            out = p.stdout.decode("latin-1")
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode("latin-1") + "\n[timeout]"
    processes = PROCESS_RE.findall(out)
    statuses = STATUS_RE.findall(out)
    reset = "SR token" in out or "Stateless Reset" in out or "stateless reset" in out.lower()
    ok = len(statuses) == requests and all(s == "200" for s in statuses) and \
        len(processes) == requests
    return Fetch(ok, processes, statuses, out, reset)


def run_clients(port, total=200, concurrency=20, **kw):
    """`total` connections, `concurrency` at a time; returns the list of Fetch results."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda _: h3_fetch(port, **kw), range(total)))


def process_reports(srv):
    """GET /processes from the control API (`corral ctl processes`): the slots and, per live
    process, what it last reported of its HTTP/3 state (every second)."""
    out = subprocess.run([CORRAL_BIN, "ctl", "processes", "--json", "--state-dir",
                          srv.state_dir],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=ceiling(10))
    return json.loads(out.stdout)["processes"]


def summarize(results):
    good = [r for r in results if r.ok and len(set(r.processes)) == 1]
    split = [r for r in results if r.ok and len(set(r.processes)) != 1]
    slots = {}
    for r in good:
        s = r.processes[0].split()[0]
        slots[s] = slots.get(s, 0) + 1
    return good, split, slots
