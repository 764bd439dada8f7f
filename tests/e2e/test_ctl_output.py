"""`corral ctl` for a person and for a script (docs/operate.md, "The control socket"), on one
corral started in a temporary directory with a relative `state_dir` in its config file:

  * `--config FILE` finds the running corral as `serve` found its state directory (relative to
    the working directory, as serve's);
  * `processes`, `workers` and `kinds` print aligned tables, `--json` the control API's JSON;
    `top --count N` prints N frames when stdout is not a terminal;
  * retry, stop, suspend, resume print one line saying what happened; a refusal is one line on
    stderr (what failed, what to do) with exit 1 and nothing on stdout; no corral is exit 69;
  * a worker that crashes: `ctl logs ADDRESS` prints its traceback, each line with its UTC time,
    address and pid; `-f` follows new lines as they are written; the failed entry names the log
    (`"log"` in the JSON, `see: corral ctl logs ADDRESS` in the table).
"""
import datetime
import http.client
import json
import os
import re
import select
import signal
import subprocess
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, control_get, poll, wait_control_socket

PYTHON = "/usr/bin/python3"
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z (\S+) \[(\d+)\] (.*)$")

# Says hello, leaves a partial line on stdout and dies of an exception in its setup: a traceback
# on stderr, as a Python worker's mistake looks.
CRASHING_WORKER = """import sys
print("hello from the crashing worker", flush=True)
sys.stdout.write("a partial line")
sys.stdout.flush()
raise RuntimeError("boom in setup")
"""


class Corral:
    def __init__(self, cwd):
        self.cwd = cwd
        self.state_dir = os.path.join(cwd, "rel-state")
        self.log_path = os.path.join(cwd, "serve.log")
        self.proc = None
        self.port = None

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def ctl(self, *args, cwd=None, timeout=None):
        """`corral ctl ARGS --config corral.toml`, run where serve runs (the relative paths)."""
        return subprocess.run([CORRAL_BIN, "ctl", *args, "--config", "corral.toml"],
                              cwd=cwd or self.cwd, capture_output=True, text=True,
                              timeout=timeout or ceiling(10))

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ceiling(10))
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    cwd = str(tmp_path_factory.mktemp("ctl"))
    with open(os.path.join(cwd, "crash.py"), "w") as f:
        f.write(CRASHING_WORKER)
    with open(os.path.join(cwd, "corral.toml"), "w") as f:
        f.write('listen = "127.0.0.1:0"\nstate_dir = "rel-state"\n'
                f"[workers.crash]\ncommand = {json.dumps([PYTHON, '-S', 'crash.py'])}\n"
                'routes = ["/crash/{id}/*"]\n')
    c = Corral(cwd)
    with open(c.log_path, "w") as log:
        c.proc = subprocess.Popen([CORRAL_BIN, "serve", "--config", "corral.toml",
                                   "--no-access-log"], cwd=cwd, stdout=log, stderr=log,
                                  stdin=subprocess.DEVNULL)
    try:
        m = poll(lambda: re.search(r"listening address=[\d.]+:(\d+)", c.log())
                 or c.proc.poll() is not None, ceiling(20), "corral listening", detail=c.log)
        assert c.proc.poll() is None, c.log()
        c.port = int(m.group(1))
        wait_control_socket(c.state_dir, ceiling(10), what="control socket", detail=c.log)
        yield c
    finally:
        c.proc.send_signal(signal.SIGTERM)
        try:
            c.proc.wait(ceiling(10))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def columns(header, row):
    """The cells of a table row, cut where the header's columns start (values may hold spaces)."""
    starts = [m.start() for m in re.finditer(r"(?:(?<=  )|^)\S", header)]
    return [row[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]


def test_config_finds_the_state_dir_and_tables_align(corral):
    r = corral.ctl("processes")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "generation 1", r.stdout
    header = lines[1]
    assert header.split() == ["SLOT", "PID", "CPU", "GEN", "STATUS", "UPTIME", "RESTARTS", "LAST",
                              "EXIT", "BACKOFF"], r.stdout
    state = json.loads(corral.ctl("processes", "--json").stdout)
    row = columns(header, lines[2])
    assert row[0] == "0" and row[1] == str(state["processes"][0]["pid"]), (row, state)
    assert row[4] == "running" and re.fullmatch(r"\d+(s|m\d\ds)", row[5]), row
    # The same answer from another working directory, with --state-dir.
    r = subprocess.run([CORRAL_BIN, "ctl", "kinds", "--state-dir", corral.state_dir],
                       capture_output=True, text=True, timeout=ceiling(10))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["KIND", "VERSION", "DIRTY", "ROLLING", "WORKERS",
                                                "STALE", "KEPT"], r.stdout
    assert r.stdout.splitlines()[1].split()[0] == "crash"
    assert json.loads(corral.ctl("kinds", "--json").stdout)["crash"]["workers"] == 0
    r = corral.ctl("workers")
    assert r.returncode == 0 and r.stdout.split() == ["ADDRESS", "STATUS", "PID", "HOLDS", "IDLE",
                                                      "STOP", "DETAIL"], r.stdout
    assert corral.ctl("workers", "--json").stdout.strip() == "{}"


def test_top_prints_frames_when_not_a_terminal(corral):
    r = corral.ctl("top", "--count", "2", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("corral top ") == 2 and "\x1b" not in r.stdout, r.stdout
    assert r.stdout.count("SLOT  PID") == 2 and r.stdout.count("KIND ") == 2, r.stdout


def test_every_verb_prints_a_line_and_refusals_go_to_stderr(corral):
    r = corral.ctl("suspend", "crash:s")
    assert (r.returncode, r.stderr) == (0, ""), r.stdout + r.stderr
    assert r.stdout == ("crash:s: suspended: its requests get 503 until corral ctl resume "
                        "crash:s\n"), r.stdout
    r = corral.ctl("resume", "crash:s", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"address": "crash:s", "entry": None}
    r = corral.ctl("retry", "crash:s")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr == ("corral: ctl retry crash:s: The address is neither failed nor suspended. "
                        "(not_found, 404); see: corral ctl workers\n"), r.stderr
    r = corral.ctl("stop")
    assert r.returncode == 2 and "needs an ADDRESS" in r.stderr and r.stdout == "", r.stderr
    r = corral.ctl("logs", "nokind:1")
    assert r.returncode == 1 and "(unknown_kind, 404)" in r.stderr and r.stdout == "", r.stderr


def test_no_corral_and_a_bad_config_have_their_own_exit_status(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    r = subprocess.run([CORRAL_BIN, "ctl", "workers", "--state-dir", str(empty)],
                       capture_output=True, text=True, timeout=ceiling(10))
    assert r.returncode == 69 and r.stdout == "", r.stdout
    assert len(r.stderr.splitlines()) == 1 and "--state-dir DIR" in r.stderr, r.stderr
    (tmp_path / "bad.toml").write_text('listen = 8080\n')
    r = subprocess.run([CORRAL_BIN, "ctl", "--config", str(tmp_path / "bad.toml")],
                       capture_output=True, text=True, timeout=ceiling(10))
    assert r.returncode == 78 and "corral check --config" in r.stderr, r.stderr


def read_until(proc, needle, timeout):
    """What `proc` printed on stdout until `needle` appeared; fails after `timeout` s."""
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        left = deadline - time.monotonic()
        assert left > 0, out.decode(errors="replace")
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, out.decode(errors="replace")  # it ended before the needle
            out += chunk
    return out.decode()


def failed(corral, address):
    return poll(lambda: ((control_get(corral.state_dir, "/workers") or {}).get(address) or {})
                .get("status") == "failed" and control_get(corral.state_dir, "/workers")[address],
                ceiling(10), f"{address} failed")


def test_logs_of_a_crashed_worker_with_timestamps(corral):
    status, _ = corral.get("/crash/y/")
    assert status >= 500
    entry = failed(corral, "crash:y")
    # As serve names it: relative to its working directory when state_dir is.
    assert os.path.join(corral.cwd, entry["log"]) == os.path.join(corral.state_dir, "logs",
                                                                  "crash.log"), entry

    r = corral.ctl("logs", "crash:y")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    texts = []
    for line in lines:
        m = LINE.match(line)
        assert m and m.group(2) == "crash:y", line
        at = datetime.datetime.fromisoformat(m.group(1))
        assert abs((now - at).total_seconds()) < 300, (line, now)
        texts.append(m.group(4))
    assert texts[0] == "hello from the crashing worker", texts
    assert "Traceback (most recent call last):" in texts, texts
    assert "a partial line" in texts and "RuntimeError: boom in setup" in texts, texts
    assert len({LINE.match(line).group(3) for line in lines}) == 1  # one worker, one pid
    r = corral.ctl("logs", "crash:y", "-n", "2")
    assert r.stdout.splitlines() == lines[-2:], r.stdout
    # The table points to them.
    r = corral.ctl("workers")
    row = next(line for line in r.stdout.splitlines() if line.startswith("crash:y "))
    assert "failed" in row and row.endswith("(see: corral ctl logs crash:y)"), row

    # -f: the tail first (then it is subscribed), then the next worker's lines as they come.
    follow = subprocess.Popen([CORRAL_BIN, "ctl", "logs", "crash:y", "-f", "-n", "1",
                               "--config", "corral.toml"], cwd=corral.cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert read_until(follow, b"\n", ceiling(10)) == lines[-1] + "\n"
        assert corral.ctl("retry", "crash:y").returncode == 0
        status, _ = corral.get("/crash/y/")
        followed = read_until(follow, b"RuntimeError: boom in setup", ceiling(20))
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(ceiling(10))
    assert follow.returncode == 0, follow.stderr.read()
    new = [LINE.match(line) for line in followed.splitlines()]
    assert all(m and m.group(2) == "crash:y" for m in new), followed
    assert new[0].group(4) == "hello from the crashing worker", followed
    assert new[0].group(3) != LINE.match(lines[0]).group(3)  # the next worker's pid
