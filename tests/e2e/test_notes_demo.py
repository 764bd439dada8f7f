"""The notes demo (examples/notes, issue 4): a note per address `note:<id>`, a worker process each,
its state in a SQLite file per address (<state dir>/notes/<address percent-encoded>.sqlite), kept
in memory, written every 2 s while changed and by a closer when the worker stops.

Run two ways, the same checks each:
  * "demo":   `corral serve --listen … --state-dir …` with no config and no DIR: corral finds
              `corral-notes-worker` next to itself and serves it on "/note/{id}/*" (src/cli/demo.h);
  * "config": a config declaring `[workers.note]` with the program's path explicitly.
Both are skipped when `corral-notes-worker` is not built next to the corral binary (or at
$CORRAL_NOTES_WORKER).

What is checked: the page (HTML, the response's CSP nonce on its inline script and style, the text
escaped), GET/POST /text and GET /rev, writes kept in memory and flushed by the 2 s timer, the
closer's flush at SIGTERM of corral and at `ctl stop`, the state surviving a restart of corral on
the same state directory, two addresses in two files, the notes directory 0700 and files 0600.
"""
import http.client
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import time
import urllib.parse

import pytest

from conftest import CORRAL_BIN

NOTES_WORKER = os.environ.get(
    "CORRAL_NOTES_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "corral-notes-worker"))


def poll(fn, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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
        poll(lambda: os.path.exists(os.path.join(self.state_dir, "control.sock")), 5,
             "the control socket")
        return self

    def stop(self):
        """SIGTERM corral; it exits 0 once every worker ran its closers."""
        self.srv.signal(signal.SIGTERM)
        assert self.srv.wait_exit(timeout=15) == 0, self.srv.log()[-3000:]
        assert "worker_failed" not in self.srv.log()

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

    # A write answers the new revision; reads see it at once.
    assert n.save("a", "first") == 1
    assert (n.text("a"), n.rev("a")) == ("first", 1)
    # The 2 s timer writes it to the file while the worker runs.
    poll(lambda: n.stored("a") == ("first", 1), 5, "the timer's flush of 'first'")

    # Another address: another worker, another file.
    assert n.save("b", "other ✓") == 1
    assert n.text("b") == "other ✓"
    assert n.text("a") == "first"

    # A write is kept in memory: the file still has the previous one right after it...
    assert n.save("a", "hello") == 2
    assert n.text("a") == "hello"
    assert n.stored("a") == ("first", 1)
    # ...and the closer writes it when corral stops (SIGTERM: every worker is stopped).
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


def test_stop_flushes_and_text_is_escaped(notes):
    n = notes
    evil = "</textarea><script>alert(1)</script>&"
    assert n.save("c", evil) == 1
    status, _, body = n.request("GET", "/note/c/")
    page = body.decode()
    assert status == 200
    assert "<script>alert(1)" not in page
    assert "&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;&amp;</textarea>" in page
    assert n.text("c") == evil  # /text is the text as written

    # `ctl stop` (as an idle stop would): the closer writes the last text before the exit.
    assert n.save("c", "after") == 2
    r = subprocess.run([CORRAL_BIN, "ctl", "stop", "note:c", "--state-dir", n.state_dir],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    poll(lambda: n.stored("c") == ("after", 2), 5, "the closer's flush at stop")
    # the next request starts a new worker, which reads it
    assert (n.text("c"), n.rev("c")) == ("after", 2)
    # a key with bytes outside the unreserved set: a percent-encoded file name
    assert n.save("x%20y", "spaced") == 1
    n.stop()
    assert os.path.exists(os.path.join(n.state_dir, "notes", "note%3Ax%20y.sqlite"))


def test_welcome_page_links_the_demo(notes):
    if notes.mode != "demo":
        pytest.skip("the link is on the demo's welcome page")
    status, _, body = notes.request("GET", "/")
    assert status == 200
    assert b'href="/note/welcome/"' in body
    assert notes.request("GET", "/note/welcome/")[0] == 200
