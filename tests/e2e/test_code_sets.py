"""Code sets of any size and shape, on the real binary (`corral serve` with `[workers.doc] code`,
the Python example worker; docs/deploying.md, docs/worker-protocol.md):

  * a code directory of 3,000 small files starts its kind and rolls out in place: `start` and
    `reload` carry the snapshot's manifest path (`code.manifest`), not the file list, which the
    worker library reads (the worker's `scripts` are the 3,001 files);
  * a snapshot runs off the supervisor's loop: while one is under way (held by the test build's
    CORRAL_TEST_SNAPSHOT_HOLD file, so "under way" is an event, not a race) a proxied request to a
    running worker and the control socket (`GET /workers`) are answered, and the rollout is still
    waiting; a sparse 1 GiB file in the directory is stored sparse;
  * a snapshot that is refused (a FIFO in the directory) is logged `rollout_refused` with its
    reason, changes nothing, and `corral check` names it beforehand;
  * a kept version that a waiting `--to` names is still there when its turn comes, although the
    rollout before it pushed it out of the last five;
  * SIGTERM while a snapshot is under way: the snapshot's thread is stopped and joined, corral
    exits 0.
"""
import http.client
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_get, ctl, poll, wait_control_socket

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
PYTHON = sys.executable or "/usr/bin/python3"
SANITIZED = os.environ.get("CORRAL_SANITIZED") == "1"
SLOW = 3 if SANITIZED else 1  # ceilings scale under ASan


def config(extra=""):
    return "\n".join([
        "[workers.doc]",
        f"command = [{json.dumps(PYTHON)}, {json.dumps(PY_WORKER)}]",
        'routes = ["/doc/{id}/*"]',
        'code = "code"',
        'reload = "in-place"',
        extra,
    ]) + "\n"


class Served:
    def __init__(self, srv, tmp_path):
        self.srv = srv
        self.state_dir = str(tmp_path / "state")
        self.code = tmp_path / "code"

    def get(self, path, timeout=30 * SLOW):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def code_of(self, key):
        status, body = self.get(f"/doc/{key}/code")
        assert status == 200, (status, body, self.srv.log()[-3000:])
        return json.loads(body)

    def rollout(self, *args, timeout=60 * SLOW):
        r = ctl(self.state_dir, "rollout", "doc", *args, "--json", timeout=timeout)
        report = json.loads(r.stdout) if r.stdout.strip() else None
        return r.returncode, report, r.stderr

    def spawn_rollout(self, *args):
        return subprocess.Popen([CORRAL_BIN, "ctl", "rollout", "doc", *args, "--json",
                                 "--state-dir", self.state_dir],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def version(self):
        kinds = control_get(self.state_dir, "/workers/kinds")
        return kinds["doc"]["version"] if kinds else None


@pytest.fixture
def corral(server_factory, tmp_path):
    def make(files, env=None, extra=""):
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        for path, data in files.items():
            p = code / path
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(data)
        srv = server_factory("--state-dir", str(tmp_path / "state"), "--no-access-log",
                             binary=CORRAL_BIN, config=config(extra), env=env)
        wait_control_socket(str(tmp_path / "state"), 10 * SLOW)
        return Served(srv, tmp_path)
    return make


def test_a_set_of_3000_files_starts_and_rolls_out(corral):
    files = {f"lib/p{i // 100:02}/m{i:04}.py": f"x = {i}\n" for i in range(3000)}
    files["hello.txt"] = "one"
    c = corral(files)
    first = c.code_of("1")
    assert first["hello"] == "one" and first["version"] == c.version(), first
    status, body = c.get("/doc/1/start")
    assert status == 200
    scripts = json.loads(body)["scripts"]
    assert len(scripts) == 3001 and scripts[0]["path"] == "hello.txt", scripts[:3]

    (c.code / "hello.txt").write_text("two")
    rc, report, err = c.rollout()
    assert rc == 0 and report["failed"] == 0, (rc, report, err, c.srv.log()[-3000:])
    assert [w.get("report") for w in report["workers"]] == [{"hello": "two"}], report
    now = c.code_of("1")
    assert now["pid"] == first["pid"] and now["hello"] == "two", now  # reloaded in place
    assert now["version"] == report["version"] == c.version()
    # A new address starts on it.
    assert c.code_of("2")["version"] == report["version"]


def test_a_snapshot_runs_off_the_loop_and_keeps_a_sparse_file_sparse(corral, tmp_path):
    hold = tmp_path / "hold-snapshot"
    code = tmp_path / "code"
    code.mkdir()
    # 1 GiB (not 4): every snapshot hashes its zeros, ~1 s a GiB without SHA extensions.
    with open(code / "disk.img", "wb") as f:
        f.truncate(1 << 30)
    c = corral({"hello.txt": "one"}, env={"CORRAL_TEST_SNAPSHOT_HOLD": str(hold)})
    before = c.code_of("1")
    assert before["hello"] == "one"

    hold.write_text("")
    (c.code / "hello.txt").write_text("two")
    roll = c.spawn_rollout()
    try:
        c.srv.wait_log(r"rollout_snapshot kind=doc", timeout=30 * SLOW)
        # The snapshot cannot end while the hold file exists: what follows happens during it.
        assert c.code_of("1")["pid"] == before["pid"]
        workers = control_get(c.state_dir, "/workers", timeout=10 * SLOW)
        assert workers and "doc:1" in workers, workers
        assert roll.poll() is None, roll.communicate()
        assert "rollout_snapshot_done" not in c.srv.log()
        hold.unlink()
        out, err = roll.communicate(timeout=60 * SLOW)
    finally:
        if roll.poll() is None:
            roll.kill()
    assert roll.returncode == 0, (out, err, c.srv.log()[-3000:])
    assert c.code_of("1")["hello"] == "two"
    # The stored copy of the sparse file is sparse too.
    objects = os.path.join(c.state_dir, "code", "objects")
    big = [os.stat(os.path.join(objects, n)) for n in os.listdir(objects)
           if os.stat(os.path.join(objects, n)).st_size == 1 << 30]
    assert len(big) == 1, os.listdir(objects)
    assert big[0].st_blocks * 512 < 1 << 20, big[0]


def test_a_refused_snapshot_is_logged_checked_and_changes_nothing(corral):
    c = corral({"hello.txt": "one"})
    before = c.code_of("1")
    version = c.version()
    os.mkfifo(c.code / "pipe")
    rc, report, err = c.rollout()
    assert rc == 1 and "snapshot_failed" in err, (rc, report, err)
    m = c.srv.wait_log(r"warn rollout_refused kind=doc code=snapshot_failed error=\"([^\n]*)\"")
    assert str(c.code / "pipe") in m.group(1) and "fifo" in m.group(1), m.group(0)
    assert c.version() == version
    assert c.code_of("1") == before
    # `corral check` says so before any serve.
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(c.code.parent / "corral.toml")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 78, r
    assert "workers.doc.code: " in r.stderr and str(c.code / "pipe") in r.stderr, r.stderr


def test_a_version_a_waiting_rollout_names_is_kept(corral, tmp_path):
    hold = tmp_path / "hold-snapshot"
    c = corral({"hello.txt": "v0"}, env={"CORRAL_TEST_SNAPSHOT_HOLD": str(hold)})
    c.code_of("1")
    oldest = c.version()
    for i in range(1, 5):  # five kept versions: v0 is the oldest of them
        (c.code / "hello.txt").write_text(f"v{i}")
        rc, report, err = c.rollout()
        assert rc == 0, (rc, report, err)
    kept = [v["version"] for v in control_get(c.state_dir, "/workers/kinds")["doc"]["versions"]]
    assert len(kept) == 5 and kept[-1] == oldest, kept

    # A sixth version, held in its snapshot, and a rollback to v0 waiting behind it.
    hold.write_text("")
    (c.code / "hello.txt").write_text("v5")
    newest = c.spawn_rollout()
    back = None
    try:
        poll(lambda: c.srv.log().count("rollout_snapshot kind=doc ") == 5, 30 * SLOW,
             what="the sixth version's snapshot", detail=lambda: c.srv.log()[-3000:])
        back = c.spawn_rollout("--to", oldest[:12])
        c.srv.wait_log(r"rollout_queued kind=doc", timeout=30 * SLOW)
        hold.unlink()
        out, err = newest.communicate(timeout=60 * SLOW)
        assert newest.returncode == 0, (out, err)
        out, err = back.communicate(timeout=60 * SLOW)
        assert back.returncode == 0, (out, err, c.srv.log()[-3000:])
    finally:
        for p in (newest, back):
            if p and p.poll() is None:
                p.kill()
    assert c.version() == oldest
    assert c.code_of("1")["hello"] == "v0"


def test_a_stop_during_a_snapshot_ends_it_and_exits(corral, tmp_path):
    hold = tmp_path / "hold-snapshot"
    c = corral({"hello.txt": "one"}, env={"CORRAL_TEST_SNAPSHOT_HOLD": str(hold)})
    c.code_of("1")
    hold.write_text("")
    (c.code / "hello.txt").write_text("two")
    roll = c.spawn_rollout()
    try:
        c.srv.wait_log(r"rollout_snapshot kind=doc", timeout=30 * SLOW)
        # The snapshot holds for as long as the file exists: only the stop can end it.
        c.srv.signal(signal.SIGTERM)
        assert c.srv.wait_exit(timeout=30 * SLOW) == 0, c.srv.log()[-3000:]
        roll.communicate(timeout=30 * SLOW)
    finally:
        if roll.poll() is None:
            roll.kill()
    assert "rollout_snapshot_done" not in c.srv.log()
    assert "ERROR: AddressSanitizer" not in c.srv.log()
