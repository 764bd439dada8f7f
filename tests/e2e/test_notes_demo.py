"""The notes demo (examples/notes, issue 4): a note per address `note:<id>`, a worker process each,
its state in a SQLite file per address (<state dir>/notes/<address percent-encoded>.sqlite, WAL,
synchronous=FULL): a save is answered only once it is committed (issue 11, defect 4).

Run two ways, the same checks each:
  * "demo":   `corral serve --listen … --state-dir …` with no config and no DIR: corral finds
              `corral-notes-worker` next to itself and serves it on "/note/{id}/*" (src/cli/demo.h);
  * "config": a config declaring `[workers.note]` with the program's path explicitly.
Both are skipped when `corral-notes-worker` is not built next to the corral binary (or at
$CORRAL_NOTES_WORKER).

What is checked: the page (HTML, the response's CSP nonce on its inline script and style, the text
escaped), GET/POST /text and GET /rev, each acknowledged write in the file at once, the state
surviving SIGTERM of corral, `ctl stop`, a kill -9 of the worker and `ctl retry`, and a restart of
corral on the same state directory (revisions going on, never back), two addresses in two files,
the notes directory 0700 and files 0600.
"""
import http.client
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import urllib.parse

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, ctl, ctl_json, poll, wait_control_socket

NOTES_WORKER = os.environ.get(
    "CORRAL_NOTES_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "corral-notes-worker"))


class Notes:
    def __init__(self, factory, mode, state_dir):
        self.factory = factory
        self.mode = mode
        self.state_dir = state_dir
        self.srv = None

    def start(self):
        args = ["--state-dir", self.state_dir]
        config = None
        if self.mode == "config":
            config = ("[workers.note]\n"
                      f"command = [{json.dumps(NOTES_WORKER)}]\n"
                      'routes = ["/note/{id}/*"]\n')
        self.srv = self.factory(*args, binary=CORRAL_BIN, config=config)
        wait_control_socket(self.state_dir, 5, what="the control socket", interval=0.05)
        return self

    def stop(self, failures=0):
        """SIGTERM corral; it exits 0 once every worker ran its closers. `failures`: the workers
        the test itself made fail (kill -9)."""
        self.srv.signal(signal.SIGTERM)
        assert self.srv.wait_exit(timeout=15) == 0, self.srv.log()[-3000:]
        assert self.srv.log().count("worker_failed") == failures, self.srv.log()[-3000:]

    def request(self, method, path, body=None, timeout=10):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def text(self, key):
        status, _, body = self.request("GET", f"/note/{key}/text")
        assert status == 200, (status, body)
        return body.decode()

    def rev(self, key):
        status, _, body = self.request("GET", f"/note/{key}/rev")
        assert status == 200, (status, body)
        return int(body)

    def save(self, key, text):
        status, _, body = self.request("POST", f"/note/{key}/text", body=text.encode())
        assert status == 200, (status, body)
        return int(body)

    def ctl(self, *args):
        return ctl(self.state_dir, *args)

    def workers(self):
        """The manager's entries (`corral ctl workers`): {address: {status, pid, ...}}."""
        return ctl_json(self.state_dir, "workers")

    def path(self, key):
        return os.path.join(self.state_dir, "notes", f"note%3A{key}.sqlite")

    def stored(self, key):
        """(text, rev) in the SQLite file, None when the file or the row is not there."""
        if not os.path.exists(self.path(key)):
            return None
        # (a URI, read-only: the "%" of the file name is escaped)
        db = sqlite3.connect(f"file:{urllib.parse.quote(self.path(key))}?mode=ro", uri=True,
                             timeout=5)
        try:
            row = db.execute("SELECT text, rev FROM note WHERE id = 1").fetchone()
        except sqlite3.OperationalError:  # no table yet
            return None
        finally:
            db.close()
        return tuple(row) if row else None


@pytest.fixture(params=["demo", "config"])
def notes(request, server_factory, tmp_path):
    if not os.access(NOTES_WORKER, os.X_OK):
        pytest.skip(f"{NOTES_WORKER} is not built")
    return Notes(server_factory, request.param, str(tmp_path / "state")).start()


def test_page_text_rev_and_state_across_restart(notes):
    n = notes
    # The page: HTML from the worker, with the response's nonce on the inline script and style.
    status, headers, body = n.request("GET", "/note/a/")
    assert status == 200, body
    assert headers["content-type"].startswith("text/html"), headers
    m = re.search(r"'nonce-([A-Za-z0-9+/=_-]+)'", headers["content-security-policy"])
    assert m, headers
    page = body.decode()
    assert f'<script nonce="{m.group(1)}">' in page
    assert f'<style nonce="{m.group(1)}">' in page
    assert "<textarea" in page and "note:a" in page
    # a second page load, a second nonce (the worker's own, per response)
    _, headers2, body2 = n.request("GET", "/note/a/")
    m2 = re.search(r"'nonce-([A-Za-z0-9+/=_-]+)'", headers2["content-security-policy"])
    assert m2 and m2.group(1) != m.group(1) and m2.group(1) in body2.decode()

    # A new note: empty, revision 0.
    assert n.text("a") == ""
    assert n.rev("a") == 0

    # A write answers the new revision once it is in the file; reads see it at once.
    assert n.save("a", "first") == 1
    assert n.stored("a") == ("first", 1)
    assert (n.text("a"), n.rev("a")) == ("first", 1)

    # Another address: another worker, another file.
    assert n.save("b", "other ✓") == 1
    assert n.text("b") == "other ✓"
    assert n.text("a") == "first"

    assert n.save("a", "hello") == 2
    assert n.stored("a") == ("hello", 2)
    assert n.text("a") == "hello"
    # SIGTERM: every worker is stopped; the files keep what was acknowledged.
    n.stop()
    assert n.stored("a") == ("hello", 2)
    assert n.stored("b") == ("other ✓", 1)

    notes_dir = os.path.join(n.state_dir, "notes")
    assert stat.S_IMODE(os.stat(notes_dir).st_mode) == 0o700
    assert sorted(f for f in os.listdir(notes_dir) if f.endswith(".sqlite")) == [
        "note%3Aa.sqlite", "note%3Ab.sqlite"]
    assert stat.S_IMODE(os.stat(n.path("a")).st_mode) == 0o600

    # A new corral on the same state directory: the state survived.
    n.start()
    assert (n.text("a"), n.rev("a")) == ("hello", 2)
    assert (n.text("b"), n.rev("b")) == ("other ✓", 1)
    status, _, body = n.request("GET", "/note/a/")
    assert status == 200 and ">hello</textarea>" in body.decode()
    n.stop()


def test_stop_keeps_the_note_and_text_is_escaped(notes):
    n = notes
    evil = "</textarea><script>alert(1)</script>&"
    assert n.save("c", evil) == 1
    status, _, body = n.request("GET", "/note/c/")
    page = body.decode()
    assert status == 200
    assert "<script>alert(1)" not in page
    assert "&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;&amp;</textarea>" in page
    assert n.text("c") == evil  # /text is the text as written

    # `ctl stop` (as an idle stop would): the last text is there for the next worker.
    assert n.save("c", "after") == 2
    r = n.ctl("stop", "note:c")
    assert r.returncode == 0, r.stderr
    poll(lambda: "note:c" not in n.workers(), 5, "the worker's stop", interval=0.05)
    assert n.stored("c") == ("after", 2)
    # the next request starts a new worker, which reads it
    assert (n.text("c"), n.rev("c")) == ("after", 2)
    # a key with bytes outside the unreserved set: a percent-encoded file name
    assert n.save("x%20y", "spaced") == 1
    n.stop()
    assert os.path.exists(os.path.join(n.state_dir, "notes", "note%3Ax%20y.sqlite"))


def test_page_names_its_file_worker_and_version(notes):
    """The page says where the note really is (the absolute path of the file the worker opened,
    not one relative to a directory the reader has to guess) and which process serves it; it has
    a viewport, an icon that is there, and the version."""
    n = notes
    status, _, body = n.request("GET", "/note/p/")
    assert status == 200, body
    page = body.decode()
    m = re.search(r'<code id="file">([^<]+)</code>', page)
    assert m, page
    assert os.path.isabs(m.group(1)) and os.path.exists(m.group(1)), m.group(1)
    assert m.group(1) == os.path.realpath(n.path("p"))
    m = re.search(r'<span id="pid">(\d+)</span>', page)
    assert m and int(m.group(1)) == n.workers()["note:p"]["pid"], page
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert '<link rel="icon" href="favicon.svg" type="image/svg+xml">' in page
    version = subprocess.run([CORRAL_BIN, "--version"], capture_output=True, text=True,
                             timeout=ceiling(10)).stdout.split()[-1]
    assert f"corral {version}:" in page and "<code>docs/worker-protocol.md</code>" in page, page
    status, headers, body = n.request("GET", "/note/p/favicon.svg")
    assert status == 200 and headers["content-type"] == "image/svg+xml", (status, headers)
    assert body.startswith(b"<svg ")
    n.stop()


def test_welcome_page_links_the_demo(notes):
    if notes.mode != "demo":
        pytest.skip("the link is on the demo's welcome page")
    status, _, body = notes.request("GET", "/")
    assert status == 200
    assert b'href="/note/welcome/"' in body
    assert notes.request("GET", "/note/welcome/")[0] == 200


def test_kill_9_loses_no_acknowledged_save(notes):
    """Issue 11, defect 4: five saves, all answered; kill -9 of the worker (no closer runs);
    after `ctl retry` the note has the last text and revision 5, and the next save is 6."""
    n = notes
    for i in range(1, 6):
        assert n.save("k1", f"text {i}") == i
    assert n.stored("k1") == ("text 5", 5)  # in the file before the answer, not 2 s later
    pid = poll(lambda: n.workers().get("note:k1", {}).get("pid"), 5, "the worker's pid",
               interval=0.05)
    os.kill(pid, signal.SIGKILL)
    poll(lambda: n.workers().get("note:k1", {}).get("status") == "failed", 10,
         "the worker's failure after kill -9", interval=0.05)
    r = n.ctl("retry", "note:k1")
    assert r.returncode == 0, r.stderr
    assert (n.text("k1"), n.rev("k1")) == ("text 5", 5)
    new_pid = n.workers()["note:k1"]["pid"]
    assert new_pid != pid
    assert n.save("k1", "text 6") == 6
    assert n.stored("k1") == ("text 6", 6)
    # Once more with corral itself restarted: the revision still goes on.
    n.stop(failures=1)
    n.start()
    assert (n.text("k1"), n.rev("k1")) == ("text 6", 6)
    assert n.save("k1", "text 7") == 7
    n.stop()


def test_welcome_page_says_why_the_demo_is_unavailable(tmp_path):
    """corral without corral-notes-worker next to it (scripts/run once built only `corral`): the
    startup log and the welcome page say that the demo is unavailable and why, instead of a link
    that answers 404."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    lonely = str(bindir / "corral")
    try:
        os.link(CORRAL_BIN, lonely)  # /proc/self/exe is this path: no worker beside it
    except OSError:
        import shutil
        shutil.copy2(CORRAL_BIN, lonely)
    log_path = tmp_path / "corral.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([lonely, "serve", "--listen", "127.0.0.1:0",
                                 "--state-dir", str(tmp_path / "state")],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        m = poll(lambda: re.search(r"listening address=[\d.]+:(\d+)", log_path.read_text()), 20,
                 "corral listening", interval=0.05)
        text = log_path.read_text()
        assert "demo_unavailable" in text and "corral-notes-worker is missing" in text, text
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=10)
        c.request("GET", "/")
        r = c.getresponse()
        page = r.read().decode()
        c.close()
        assert r.status == 200
        assert 'href="/note/welcome/"' not in page
        assert "the notes demo is unavailable: " in page and "corral-notes-worker is missing" in page
    finally:
        proc.terminate()
        proc.wait(timeout=10)
