"""The rollout's control surface (issue 13, docs/deploying.md), on the real binary: the
configuration keys (`[workers.<kind>] code`, `reload`, `reload_timeout`, `[workers] watch`),
`corral check`'s and `corral serve`'s refusals of a code directory that cannot be used, the
control API (`GET /workers/kinds`, `POST /workers/kinds/{kind}/rollout`) and `corral ctl kinds` /
`corral ctl rollout KIND [--to VERSION] [--json]`:

  * check: a code path that does not exist or is not a directory is "workers.<kind>.code: …",
    exit 78; the path is the config file's directory's (not the working directory's); bad reload
    and reload_timeout values and a non-boolean watch are named the same way;
  * serve: a code directory whose snapshot fails (a FIFO in it) stops serve before it listens,
    "corral: workers.doc.code: …" and exit 78;
  * ctl kinds: a table (KIND VERSION DIRTY ROLLING WORKERS STALE KEPT), '*' on the current version,
    '-' for a kind without code; --json is GET /workers/kinds;
  * ctl rollout refusals, exit 1 and the error on stderr: unknown kind (404 unknown_kind), a kind
    without code (409 no_code), --to a version that is not kept or not a version (404
    unknown_version); a body that is not {"to": string} is 400 bad_request;
  * ctl rollout without live workers: the summary line, the new version current; --to a prefix
    rolls back; --json prints the report; the worker routes /workers/{address}/... still answer.

The last three tests (after "with the other parts") need the other parts of issue 13 (the manager's rollout step, the worker
libraries' reload hook, the code watcher): a live worker reloaded in place, listed in the table,
serving the new code; --watch rolling out a saved file.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_get, ctl, poll, read_to_eof, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
PYTHON = sys.executable or "/usr/bin/python3"
EX_CONFIG = 78
HEX12 = r"[0-9a-f]{12}"


def run(*args, cwd=None):
    return subprocess.run([CORRAL_BIN, *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def kinds_config(code='"apps/doc"', extra=""):
    return "\n".join([
        "[workers.doc]",
        f'command = [{json.dumps(PYTHON)}, {json.dumps(PY_WORKER)}]',
        'routes = ["/doc/{id}/*"]',
        f"code = {code}" if code else "",
        'reload = "in-place"',
        'reload_timeout = "5s"',
        extra,
        "[workers.plain]",
        f'command = [{json.dumps(PYTHON)}, {json.dumps(PY_WORKER)}]',
        'routes = ["/plain/{id}/*"]',
    ]) + "\n"


def raw_control(state_dir, method, path, body=b"", timeout=30):
    """(status, parsed JSON body) of one request with a body on the control socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(os.path.join(state_dir, "control.sock"))
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n"
                  f"Connection: close\r\n\r\n".encode() + body)
        data = read_to_eof(s, timeout, reset_ok=False)
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(rest)


@pytest.fixture
def corral(server_factory, tmp_path):
    """`corral serve` with kind `doc` (code in apps/doc: hello.txt) and kind `plain` (no code)."""
    code = tmp_path / "apps" / "doc"
    code.mkdir(parents=True)
    (code / "hello.txt").write_text("v1\n")
    state = str(tmp_path / "state")
    srv = server_factory("--state-dir", state, "--no-access-log", binary=CORRAL_BIN,
                         config=kinds_config())
    wait_control_socket(state, 10)
    srv.state_dir = state
    srv.code = code
    return srv


def kinds(srv):
    k = control_get(srv.state_dir, "/workers/kinds")
    assert k is not None
    return k


# --- configuration ------------------------------------------------------------------------------


def test_check_reports_a_code_path_that_is_not_a_directory(tmp_path):
    cfg = tmp_path / "conf" / "corral.toml"
    cfg.parent.mkdir()
    cfg.write_text(kinds_config('"apps/doc"'))
    r = run("check", "--config", str(cfg))
    assert r.returncode == EX_CONFIG, r
    assert f"workers.doc.code: '{cfg.parent}/apps/doc' does not exist" in r.stderr, r.stderr

    (cfg.parent / "apps").mkdir()
    (cfg.parent / "apps" / "doc").write_text("a file\n")
    r = run("check", "--config", str(cfg))
    assert r.returncode == EX_CONFIG, r
    assert f"workers.doc.code: '{cfg.parent}/apps/doc' is not a directory" in r.stderr, r.stderr

    # relative to the file's directory, whatever the working directory
    (cfg.parent / "apps" / "doc").unlink()
    (cfg.parent / "apps" / "doc").mkdir()
    r = run("check", "--config", "corral.toml", cwd=str(cfg.parent))
    assert r.returncode == 0, r.stderr
    r = run("check", "--config", str(cfg), cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(": ok"), r.stdout


def test_check_names_bad_reload_timeout_and_watch_values(tmp_path):
    (tmp_path / "apps" / "doc").mkdir(parents=True)
    cfg = tmp_path / "corral.toml"
    cfg.write_text(kinds_config().replace('reload = "in-place"', 'reload = "sometimes"')
                   .replace('reload_timeout = "5s"', 'reload_timeout = "soon"')
                   + "[workers]\nwatch = \"yes\"\n")
    r = run("check", "--config", str(cfg))
    assert r.returncode == EX_CONFIG, r
    assert "workers.doc.reload: 'sometimes' is not one of auto, in-place, restart" in r.stderr
    assert "workers.doc.reload_timeout: 'soon' is not a duration" in r.stderr, r.stderr
    assert "workers.watch: expected true or false" in r.stderr, r.stderr

    cfg.write_text(kinds_config().replace('reload_timeout = "5s"', "reload_timeout = 0"))
    r = run("check", "--config", str(cfg))
    assert "workers.doc.reload_timeout: must be more than 0" in r.stderr, r.stderr

    for mode in ("auto", "in-place", "restart"):
        cfg.write_text(kinds_config().replace('reload = "in-place"', f'reload = "{mode}"')
                       + "[workers]\nwatch = true\n")
        r = run("check", "--config", str(cfg))
        assert r.returncode == 0, (mode, r.stderr)


def test_serve_refuses_code_it_cannot_snapshot(tmp_path):
    code = tmp_path / "apps" / "doc"
    code.mkdir(parents=True)
    (code / "hello.txt").write_text("v1\n")
    os.mkfifo(code / "pipe")
    cfg = tmp_path / "corral.toml"
    cfg.write_text(kinds_config())
    r = subprocess.run([CORRAL_BIN, "serve", "--listen", "127.0.0.1:0", "--config", str(cfg),
                        "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == EX_CONFIG, (r.returncode, r.stderr)
    assert "corral: workers.doc.code: " in r.stderr, r.stderr
    assert "pipe" in r.stderr, r.stderr
    assert "listening" not in r.stderr + r.stdout


# --- ctl kinds ----------------------------------------------------------------------------------


def test_ctl_kinds_prints_each_kinds_version_and_kept_versions(corral):
    k = kinds(corral)
    version = k["doc"]["version"]
    assert re.fullmatch("[0-9a-f]{64}", version), k
    assert k["doc"]["versions"] == [{"version": version, "current": True}]
    assert k["doc"]["dirty"] is False and k["doc"]["workers"] == 0, k
    assert k["doc"]["code"] == str(corral.code) and k["doc"]["reload"] == "in-place", k
    assert k["doc"]["rollout_timeout_ms"] >= 5000, k
    assert k["plain"]["version"] is None and k["plain"]["versions"] == [], k

    r = ctl(corral.state_dir, "kinds")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KIND", "VERSION", "DIRTY", "ROLLING", "WORKERS", "STALE", "KEPT"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["doc"] == ["doc", version[:12], "no", "no", "0", "0", version[:12] + "*"], lines
    assert rows["plain"] == ["plain", "-", "no", "no", "0", "0", "-"], lines

    r = ctl(corral.state_dir, "kinds", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["doc"]["version"] == version


# --- refusals -----------------------------------------------------------------------------------


def test_ctl_rollout_refusals_exit_1_with_the_error_on_stderr(corral):
    before = kinds(corral)["doc"]["version"]
    cases = [
        (("rollout", "nope"), "No worker kind is named 'nope'.", "unknown_kind, 404"),
        (("rollout", "plain"), "has no code to roll out", "no_code, 409"),
        (("rollout", "doc", "--to", "abcdef12"), "No kept version", "unknown_version, 404"),
        (("rollout", "doc", "--to", "xyz"), "is not a version", "unknown_version, 404"),
        (("rollout", "doc", "--to", before[:7]), "is not a version", "unknown_version, 404"),
    ]
    for args, message, code in cases:
        r = ctl(corral.state_dir, *args, timeout=60)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert message in r.stderr and f"({code})" in r.stderr, (args, r.stderr)
        assert r.stdout == "", (args, r.stdout)
    assert kinds(corral)["doc"]["version"] == before

    # the API directly: the same refusals, and a body that is not {"to": string}
    status, body = raw_control(corral.state_dir, "POST", "/workers/kinds/nope/rollout")
    assert status == 404 and body["error"]["code"] == "unknown_kind", body
    status, body = raw_control(corral.state_dir, "POST", "/workers/kinds/plain/rollout")
    assert status == 409 and body["error"]["code"] == "no_code", body
    for bad in (b"[1]", b"{\"to\": 5}", b"{\"version\": \"abc\"}", b"not json"):
        status, body = raw_control(corral.state_dir, "POST", "/workers/kinds/doc/rollout", bad)
        assert status == 400 and body["error"]["code"] == "bad_request", (bad, body)
    # /workers/kinds/... never reaches the address routes, and they still answer
    status, body = raw_control(corral.state_dir, "POST", "/workers/doc%3A1/retry")
    assert status == 404 and body["error"]["code"] == "not_found", body


# --- rollout and rollback without live workers --------------------------------------------------


def test_ctl_rollout_makes_the_new_code_current_and_rolls_back(corral):
    v1 = kinds(corral)["doc"]["version"]
    (corral.code / "hello.txt").write_text("v2\n")
    r = ctl(corral.state_dir, "rollout", "doc", timeout=60)
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(rf"doc: ({HEX12}) \(was ({HEX12})\): no live worker was on another "
                     r"version; 0 cleared; \d+ ms\n", r.stdout)
    assert m, r.stdout
    assert m.group(2) == v1[:12]
    k = kinds(corral)["doc"]
    v2 = k["version"]
    assert v2[:12] == m.group(1) and v2 != v1
    assert k["versions"] == [{"version": v2, "current": True}, {"version": v1, "current": False}]

    r = ctl(corral.state_dir, "rollout", "doc", "--to", v1[:8], "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["kind"] == "doc" and report["version"] == v1 and report["previous"] == v2
    assert report["workers"] == [] and report["failed"] == 0 and report["cleared"] == []
    assert isinstance(report["took_ms"], int)
    assert kinds(corral)["doc"]["version"] == v1

    status, body = raw_control(corral.state_dir, "POST", "/workers/kinds/doc/rollout",
                               json.dumps({"to": v2}).encode())
    assert status == 200 and body["version"] == v2, body


# --- with the other parts of issue 13 (after the merge) -----------------------------------------


def get(srv, path):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_ctl_rollout_lists_a_live_worker_reloaded_in_place(corral):
    status, body = get(corral, "/doc/1/code")
    assert status == 200, body
    assert json.loads(body)["hello"] == "v1\n"
    (corral.code / "hello.txt").write_text("v2\n")
    r = ctl(corral.state_dir, "rollout", "doc", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ADDRESS", "RESULT", "DETAIL"], lines
    assert lines[1].split()[:2] == ["doc:1", "reloaded"], lines
    assert re.match(rf"doc: {HEX12} \(was {HEX12}\): 1 worker: 1 reloaded, 0 restarted, "
                    r"0 stopped, 0 failed; 0 cleared; \d+ ms$", lines[-1]), lines
    status, body = get(corral, "/doc/1/code")
    assert json.loads(body)["hello"] == "v2\n", body
    assert kinds(corral)["doc"]["dirty"] is False


def test_ctl_rollout_exits_1_when_a_reload_fails(corral):
    status, body = get(corral, "/doc/1/code")
    assert status == 200, body
    (corral.code / "reload-fails").write_text("")
    r = ctl(corral.state_dir, "rollout", "doc", timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    row = r.stdout.splitlines()[1].split()
    assert row[:3] == ["doc:1", "error", "reload_failed:"], r.stdout
    assert "1 failed" in r.stdout.splitlines()[-1]
    assert kinds(corral)["doc"]["dirty"] is True


def test_watch_rolls_out_a_saved_file(server_factory, tmp_path):
    code = tmp_path / "apps" / "doc"
    code.mkdir(parents=True)
    (code / "hello.txt").write_text("v1\n")
    state = str(tmp_path / "state")
    srv = server_factory("--state-dir", state, "--no-access-log", "--watch", binary=CORRAL_BIN,
                         config=kinds_config())
    wait_control_socket(state, 10)
    srv.state_dir = state
    v1 = kinds(srv)["doc"]["version"]
    (code / "hello.txt").write_text("v2\n")
    srv.wait_log(r"watch_rollout kind=doc trigger=change", timeout=10)
    srv.wait_log(r"rollout_done kind=doc", timeout=10)
    poll(lambda: kinds(srv)["doc"]["version"] != v1, 10, what="the new version current")
