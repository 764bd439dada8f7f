"""`corral serve --watch` follows the code directory's path, not the directory (docs/deploying.md,
"The development loop"), on the real binary with the Python example worker:

  * replaced by rename (`mv code code.old; mv code.new code`, what deploy tools do): the new
    directory's content rolls out at once, and later edits to it roll out;
  * removed and made again (`rm -rf code; mkdir code`): logged while it is gone, and what the new
    directory holds rolls out;
  * a Python worker whose code imports a module beside it writes `__pycache__` into the watched
    directory: that is no change (no second rollout, and the set has no bytecode in it).
"""
import http.client
import json
import os
import shutil
import sys

import pytest

from conftest import CORRAL_BIN
from corral_test_util import poll, wait_control_socket

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
PYTHON = sys.executable or "/usr/bin/python3"
SANITIZED = os.environ.get("CORRAL_SANITIZED") == "1"
SLOW = 3 if SANITIZED else 1


class Watched:
    def __init__(self, srv, code):
        self.srv, self.code = srv, code

    def code_of(self, key="1"):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=30 * SLOW)
        try:
            c.request("GET", f"/doc/{key}/code")
            r = c.getresponse()
            body = r.read()
        finally:
            c.close()
        assert r.status == 200, (r.status, body, self.srv.log()[-3000:])
        return json.loads(body)

    def wait_hello(self, hello):
        poll(lambda: self.code_of()["hello"] == hello, 30 * SLOW, what=f"hello {hello!r}",
             detail=lambda: self.srv.log()[-3000:])

    def rollouts(self):
        return self.srv.log().count("watch_rollout kind=doc trigger=change")


@pytest.fixture
def watched(server_factory, tmp_path):
    def make(command=None, files=None):
        code = tmp_path / "code"
        code.mkdir()
        for name, text in (files or {"hello.txt": "one"}).items():
            (code / name).write_text(text)
        argv = command or [PYTHON, PY_WORKER]
        config = "\n".join([
            "[workers.doc]",
            f"command = [{', '.join(json.dumps(a) for a in argv)}]",
            'routes = ["/doc/{id}/*"]',
            'code = "code"',
            # Python writes bytecode here unless told not to (the test's own environment may).
            'env = { PYTHONDONTWRITEBYTECODE = "" }',
        ]) + "\n"
        srv = server_factory("--state-dir", str(tmp_path / "state"), "--no-access-log", "--watch",
                             binary=CORRAL_BIN, config=config)
        wait_control_socket(str(tmp_path / "state"), 10 * SLOW)
        srv.wait_log(r"watching kind=doc", timeout=10 * SLOW)
        return Watched(srv, code)
    return make


def test_a_directory_replaced_by_rename_is_followed(watched, tmp_path):
    w = watched()
    assert w.code_of()["hello"] == "one"
    new = tmp_path / "code.new"
    new.mkdir()
    (new / "hello.txt").write_text("two")
    os.rename(w.code, tmp_path / "code.old")
    os.rename(new, w.code)
    w.wait_hello("two")
    w.srv.wait_log(r"code_watch_rearmed dir=\S+/code reason=moved_in")
    (w.code / "hello.txt").write_text("three")
    w.wait_hello("three")


def test_a_directory_removed_and_made_again_is_followed(watched):
    w = watched()
    assert w.code_of()["hello"] == "one"
    shutil.rmtree(w.code)
    w.srv.wait_log(r"code_watch_lost dir=\S+/code reason=deleted")
    w.code.mkdir()
    (w.code / "hello.txt").write_text("again")
    w.wait_hello("again")
    w.srv.wait_log(r"code_watch_rearmed dir=\S+/code reason=created")
    (w.code / "hello.txt").write_text("and again")
    w.wait_hello("and again")


def test_python_bytecode_in_the_directory_is_no_change(watched, tmp_path):
    # The layout that wrote __pycache__ into the watched directory: the command runs a script of
    # the code directory, which imports a module beside it.
    main = ("import runpy\n"
            "import helper  # beside this file: Python caches its bytecode in __pycache__ here\n"
            f"runpy.run_path({PY_WORKER!r}, run_name='__main__')\n")
    files = {"hello.txt": "one", "helper.py": "X = 1\n", "main.py": main}
    w = watched(command=[PYTHON, str(tmp_path / "code" / "main.py")], files=files)
    assert w.code_of()["hello"] == "one"
    assert any(n.startswith("helper.") for n in os.listdir(w.code / "__pycache__"))
    (w.code / "hello.txt").write_text("two")
    w.wait_hello("two")
    # One rollout, for the edit: the bytecode the worker wrote at its start was none.
    assert w.rollouts() == 1, w.srv.log()[-3000:]
    c = http.client.HTTPConnection(w.srv.host, w.srv.port, timeout=30 * SLOW)
    c.request("GET", "/doc/1/start")
    paths = [f["path"] for f in json.loads(c.getresponse().read())["scripts"]]
    c.close()
    assert paths == ["hello.txt", "helper.py", "main.py"], paths
