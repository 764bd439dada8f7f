"""Logs on the real binary: `log_format = "json"` read line by line by the real jq, the access log
in a file of its own and in the combined format, SIGUSR1 reopening it under load with no line lost,
a client's W3C traceparent reaching the worker (each library's accessor) and the access log
unchanged, and the access log naming the worker's pid and whether the request waited for its
start."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading

from conftest import CORRAL_BIN
from corral_test_util import ceiling, ctl_json, poll

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
NODE_WORKER = os.path.join(REPO, "examples", "worker_node", "worker.mjs")
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
PYTHON = sys.executable or "/usr/bin/python3"
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [l for l in f.read().split(b"\n") if l]


def jq(path):
    """Every line of `path` through `jq -c .`: fails unless each is one JSON value."""
    out = subprocess.run(["jq", "-c", "."], stdin=open(path, "rb"), capture_output=True,
                         timeout=ceiling(10), check=True).stdout
    return [json.loads(l) for l in out.splitlines()]


def get(srv, path, headers=None):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=ceiling(10))
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def start_json(server_factory, tmp_path, *args):
    """A single process with JSON logs: its port from the JSON `listening` line."""
    root = tmp_path / "site"
    root.mkdir(exist_ok=True)
    (root / "index.html").write_text("hi\n")
    srv = server_factory(str(root), "--log-format", "json", *args, binary=CORRAL_BIN, wait=False)
    return json_listening(srv)


def json_listening(srv):
    """`srv` (started with wait=False and JSON logs) once listening: its port from that line."""

    def port():
        for l in lines(srv.log_path):
            m = re.search(rb'"event":"listening","address":"[\d.]+:(\d+)"', l)
            if m:
                return int(m.group(1))
        assert srv.proc.poll() is None, srv.log()
        return None

    srv.port = poll(port, ceiling(20), "the listening line")
    return srv


def test_json_logs_parse_with_jq(server_factory, tmp_path):
    access = str(tmp_path / "access.log")
    srv = start_json(server_factory, tmp_path, "--access-log", access)
    assert get(srv, "/", {"traceparent": TRACE}) == (200, b"hi\n")
    assert get(srv, "/")[0] == 200
    # A request line the parser refuses (a byte that is not UTF-8): still one JSON line.
    s = srv.connect()
    s.sendall(b'GET /x\xff"\\y HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n')
    s.recv(4096)
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(timeout=ceiling(10))
    records = jq(access)
    assert [r["status"] for r in records] == [200, 200, 400]
    first = records[0]
    assert list(first)[:3] == ["time", "level", "event"]
    assert first["event"] == "access" and first["method"] == "GET" and first["status"] == 200
    assert first["bytes"] == 3 and isinstance(first["duration"], (int, float))
    assert first["request_id"] == TRACE
    # A request without a traceparent gets one made here (random trace-id, flags 00).
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", records[1]["request_id"])
    events = jq(srv.log_path)
    assert {"listening", "stopped"} <= {e["event"] for e in events}
    stopped = [e for e in events if e["event"] == "stopped"][0]
    assert stopped["requests"] == 2 and stopped["level"] == "info"


def test_combined_format(server_factory, tmp_path):
    access = tmp_path / "access.log"
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text("hi\n")
    cfg = f'access_log = "{access}"\naccess_log_format = "combined"\nroot = "{root}"\n'
    srv = server_factory(binary=CORRAL_BIN, config=cfg)
    assert get(srv, "/", {"Referer": "http://a/", "User-Agent": 'ua "1"'})[0] == 200
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(timeout=ceiling(10))
    (line,) = lines(str(access))
    assert re.fullmatch(rb'127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d \+0000\] '
                        rb'"GET / HTTP/1\.1" 200 3 "http://a/" "ua \\"1\\""', line), line


def test_sigusr1_reopens_under_load_nothing_lost(server_factory, tmp_path):
    """Two server processes under a supervisor; a client in a loop; the access log renamed, then
    SIGUSR1 to the supervisor: every answered request is in exactly one of the two files."""
    access = str(tmp_path / "access.log")
    root = tmp_path / "site"
    root.mkdir()
    (root / "index.html").write_text("hi\n")
    srv = server_factory(str(root), "--processes", "2", "--access-log", access,
                         "--state-dir", str(tmp_path / "state"), binary=CORRAL_BIN)
    answered, stop = [], threading.Event()

    def client():
        n = 0
        while not stop.is_set():
            n += 1
            if get(srv, f"/?n={n}")[0] == 200:
                answered.append(n)

    t = threading.Thread(target=client)
    t.start()
    try:
        poll(lambda: len(answered) >= 20, ceiling(20), "requests before the rotation")
        os.rename(access, access + ".1")
        srv.proc.send_signal(signal.SIGUSR1)
        # Both processes took it: lines land in the new file (flushed every 200 ms).
        poll(lambda: len(lines(access)) >= 10, ceiling(20), "lines in the new file")
        before = len(answered)
        poll(lambda: len(answered) >= before + 20, ceiling(20), "requests after the rotation")
    finally:
        stop.set()
        t.join(timeout=ceiling(30))
    assert srv.proc.poll() is None, srv.log()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(timeout=ceiling(20))
    seen = []
    for path in (access + ".1", access):
        for l in lines(path):
            m = re.search(rb"target=/\?n=(\d+) ", l)
            if m:
                seen.append(int(m.group(1)))
    assert sorted(seen) == sorted(set(seen)), "a request logged twice"
    assert set(answered) <= set(seen), sorted(set(answered) - set(seen))[:10]
    assert lines(access + ".1") and lines(access)
    assert "logs_reopened" in srv.log()


def test_traceparent_reaches_worker_and_access_log(server_factory, tmp_path):
    access = tmp_path / "access.log"
    cfg = "\n".join([
        f'access_log = "{access}"',
        "[workers.doc]",
        f"command = [{json.dumps(PYTHON)}, {json.dumps(PY_WORKER)}]",
        'routes = ["/doc/{id}/*"]',
    ]) + "\n"
    srv = server_factory("--state-dir", str(tmp_path / "state"), binary=CORRAL_BIN, config=cfg)
    status, body = get(srv, "/doc/1/headers", {"traceparent": TRACE})
    assert status == 200, body
    seen = [v for k, v in json.loads(body) if k.lower() == "traceparent"]
    assert seen == [TRACE]
    # An invalid one (all-zero trace-id) is replaced by one made here, passed on the same way.
    zero = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    status, body = get(srv, "/doc/1/headers", {"traceparent": zero})
    made = [v for k, v in json.loads(body) if k.lower() == "traceparent"]
    assert len(made) == 1 and re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", made[0])

    def logged():
        text = b"\n".join(lines(str(access)))
        return (f"trace={TRACE}".encode() in text and f"trace={made[0]}".encode() in text) or None

    poll(logged, ceiling(10), "the traces in the access log")
    line = [l for l in lines(str(access)) if TRACE.encode() in l][0]
    assert b'address="doc:1"' in line, line


def curl(url, *headers):
    """The body of a GET by the real curl (fails on an HTTP error)."""
    args = [a for h in headers for a in ("-H", h)]
    return subprocess.run(["curl", "-sSf", "--max-time", str(ceiling(20)), *args, url],
                          capture_output=True, text=True, timeout=ceiling(30), check=True).stdout


def access_records(path, n):
    """The first `n` JSON lines of the access log, once there are that many (flushed every 200 ms)."""
    poll(lambda: len(lines(path)) >= n or None, ceiling(10), f"{n} access lines")
    return [json.loads(l) for l in lines(path)][:n]


def test_each_worker_library_exposes_the_traceparent(server_factory, tmp_path):
    """curl's traceparent reaches a Python, a Node and a C++ worker unchanged: each echoes it from
    its library's accessor (GET /trace), and the access line of each request carries the same."""
    access = str(tmp_path / "access.log")
    kinds = {"py": [PYTHON, PY_WORKER], "node": [os.environ.get("CORRAL_NODE", "node"), NODE_WORKER],
             "cpp": [CPP_WORKER]}
    cfg = [f'access_log = "{access}"', 'log_format = "json"']
    for name, command in kinds.items():
        cfg += [f"[workers.{name}]", f"command = {json.dumps(command)}",
                f'routes = ["/{name}/{{id}}/*"]']
    srv = json_listening(server_factory("--state-dir", str(tmp_path / "state"), binary=CORRAL_BIN,
                                        config="\n".join(cfg) + "\n", wait=False))
    traces = {}
    for i, name in enumerate(kinds):
        traces[name] = f"00-4bf92f3577b34da6a3ce929d0e0e473{i}-00f067aa0ba902b7-01"
        assert curl(f"{srv.url}/{name}/1/trace", f"traceparent: {traces[name]}") == \
            traces[name] + "\n", name
    records = access_records(access, len(kinds))
    assert {r["address"]: r["request_id"] for r in records} == \
        {f"{name}:1": trace for name, trace in traces.items()}


def test_access_log_names_the_worker_and_a_cold_start(server_factory, tmp_path):
    """The first request to an address waited for its worker's start (cold) and names its pid; the
    second found it running (warm), the same pid."""
    access = str(tmp_path / "access.log")
    state = str(tmp_path / "state")
    cfg = "\n".join([
        f'access_log = "{access}"',
        'log_format = "json"',
        "[workers.doc]",
        f"command = [{json.dumps(PYTHON)}, {json.dumps(PY_WORKER)}]",
        'routes = ["/doc/{id}/*"]',
    ]) + "\n"
    srv = json_listening(
        server_factory("--state-dir", state, binary=CORRAL_BIN, config=cfg, wait=False))
    pid = json.loads(curl(f"{srv.url}/doc/7/code"))["pid"]
    assert json.loads(curl(f"{srv.url}/doc/7/code"))["pid"] == pid
    assert ctl_json(state, "workers")["doc:7"]["pid"] == pid
    first, second = access_records(access, 2)
    assert (first["address"], first["worker_pid"], first["cold"]) == ("doc:7", pid, True), first
    assert (second["address"], second["worker_pid"], second["cold"]) == ("doc:7", pid, False), second
