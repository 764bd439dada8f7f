"""The worker protocol (docs/worker-protocol.md), checked from the manager's side.

A fake manager in Python does what corral's worker manager does: a SOCK_SEQPACKET socketpair for
control (the child's end becomes fd 3), a listening Unix socket in a 0700 directory (fd 4), the
environment variables, a new process group; then `start`, and HTTP over the Unix socket. Both
example workers (examples/worker_cpp, built; examples/worker_python) run through the same tests.

Reload in place: `code_set()` writes a set of code as a plain directory (the fake manager points
`code.dir` at it, as the real one points it at a snapshot); the examples serve GET /code and reload
hello.txt (a file `reload-fails` makes their hook throw, `reload-sleep-ms` makes it slow).

Environment: CORRAL_EXAMPLE_WORKER (the C++ example_worker; default build/debug/...),
CORRAL_PYTHON (the interpreter for the Python worker; default /usr/bin/python3).
"""

import fcntl
import hashlib
import http.client
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER", os.path.join(ROOT, "build/debug/examples/worker_cpp/example_worker"))
PY_WORKER = os.path.join(ROOT, "examples/worker_python/worker.py")
PYTHON = os.environ.get("CORRAL_PYTHON", "/usr/bin/python3")
NODE_WORKER = os.path.join(ROOT, "examples/worker_node/worker.mjs")
NODE = os.environ.get("CORRAL_NODE", "node")

TIMEOUT = 10.0  # any single expected event; a passing run takes far less

# The libraries whose reload hook runs while HTTP requests are served (Python: requests on their
# threads). The C++ hook runs on the worker's loop between events: requests in flight continue
# around it, but one that arrives while it runs is read after it returns.
SERVES_DURING_RELOAD = {"python", "node"}


def worker_command(kind):
    if kind == "cpp":
        if not os.path.exists(CPP_WORKER):
            if "CORRAL_EXAMPLE_WORKER" in os.environ:
                pytest.fail(f"CORRAL_EXAMPLE_WORKER={CPP_WORKER} does not exist")
            pytest.skip(f"{CPP_WORKER} is not built")
        return [CPP_WORKER]
    if kind == "node":
        return [NODE, NODE_WORKER]
    return [PYTHON, PY_WORKER]


class CodeSet:
    """A set of a kind's code in a plain directory, with its version, `scripts` and manifest as the
    manager computes them (docs/worker-protocol.md, "Code and reload"): `start` and `reload` send
    it by reference (`code.manifest`), as the manager does."""

    _names = itertools.count()

    def __init__(self, base, files):
        self.dir = os.path.join(base, f"code-{next(CodeSet._names)}")
        os.makedirs(self.dir)
        self.scripts = []
        for path in sorted(files, key=lambda p: p.encode()):
            full = os.path.join(self.dir, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            data = files[path].encode() if isinstance(files[path], str) else files[path]
            with open(full, "wb") as f:
                f.write(data)
            self.scripts.append({"path": path, "digest": hashlib.sha256(data).hexdigest()})
        lines = b"".join(f"{s['path']}\0{s['digest']}\n".encode() for s in self.scripts)
        self.version = hashlib.sha256(lines).hexdigest()
        self.manifest = self.dir + ".json"
        with open(self.manifest, "w") as f:
            json.dump({"version": self.version, "files": self.scripts}, f)

    def code(self):
        return {"version": self.version, "dir": self.dir, "manifest": self.manifest}


def reload_message(rid, code_set):
    return {"type": "reload", "id": rid, "code": code_set.code()}


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=TIMEOUT):
        super().__init__("localhost", timeout=timeout)  # Host: localhost passes admission
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class FakeManager:
    """One worker process, as the manager would run it."""

    def __init__(self, command, base, address="doc:42", lock=None, start=None, name="w", code=None,
                 env=None, spare=False):
        self.command = command
        self.spare = spare  # a warm spare: no CORRAL_ADDRESS; `start` names the address
        self.code = code  # a CodeSet: `start` carries its scripts and code
        self.env = env or {}
        self.address = address
        self.state_dir = os.path.join(base, "state")
        os.makedirs(os.path.join(self.state_dir, "locks"), exist_ok=True)
        self.sock_dir = os.path.join(base, "sockets")
        os.makedirs(self.sock_dir, mode=0o700, exist_ok=True)
        os.chmod(self.sock_dir, 0o700)
        self.lock = lock or os.path.join(self.state_dir, "locks",
                                         urllib.parse.quote(address, safe="") + ".lock")
        self.start_data = start if start is not None else {"greeting": "hi"}
        self.sock_path = os.path.join(self.sock_dir, f"{name}.sock")
        self.log_path = os.path.join(base, f"{name}.log")
        self.proc = None
        self.ctrl = None
        self.ready = None  # the `ready` message, once start_ready() saw it

    def spawn(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(self.sock_path):
            os.unlink(self.sock_path)
        listener.bind(self.sock_path)
        listener.listen(64)
        control_fd, listen_fd = theirs.fileno(), listener.fileno()

        def child_fds():
            # fds 3 and 4 exactly; dup first so that neither source is overwritten by the other.
            a, b = os.dup(control_fd), os.dup(listen_fd)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.setpgid(0, 0)  # a new process group, as the manager does

        env = dict(os.environ)
        env.update(CORRAL_CONTROL_FD="3", CORRAL_LISTEN_FD="4", CORRAL_ADDRESS=self.address,
                   CORRAL_STATE_DIR=self.state_dir)
        env.update(self.env)
        if self.spare:
            del env["CORRAL_ADDRESS"]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, pass_fds=(3, 4),
                                     preexec_fn=child_fds)
        # The manager keeps only its own end: the worker's EOF on fd 3 then means "manager gone".
        theirs.close()
        listener.close()
        self.ctrl = ours
        return self

    def send(self, msg):
        self.ctrl.send(json.dumps(msg).encode() if isinstance(msg, dict) else msg)

    def bind(self, name):
        """What the manager does to bind a spare: its socket file renamed to the address's."""
        path = os.path.join(self.sock_dir, f"{name}.sock")
        os.rename(self.sock_path, path)
        self.sock_path = path
        self.send_start()

    def send_start(self):
        msg = {"type": "start", "address": self.address, "start": self.start_data,
               "lock": self.lock}
        if self.code:
            msg["code"] = self.code.code()
        self.send(msg)

    def send_reload(self, rid, code_set):
        self.send(reload_message(rid, code_set))

    def recv(self, timeout=TIMEOUT):
        """The next message, or None on EOF (or a reset: the worker exited with packets unread).
        Fails after `timeout`."""
        r, _, _ = select.select([self.ctrl], [], [], timeout)
        assert r, f"no control message within {timeout} s; log:\n{self.output()}"
        try:
            data = self.ctrl.recv(1 << 20)
        except ConnectionResetError:
            return None
        return json.loads(data) if data else None

    def quiet_for(self, seconds):
        """True if no control message arrives within `seconds` (waiting for absence needs a bound)."""
        r, _, _ = select.select([self.ctrl], [], [], seconds)
        return not r

    def expect(self, type_, timeout=TIMEOUT):
        msg = self.recv(timeout)
        assert msg is not None and msg.get("type") == type_, \
            f"expected {type_}, got {msg}; log:\n{self.output()}"
        return msg

    def expect_skipping_idle(self, type_, timeout=TIMEOUT):
        """The next message that is not an `idle` flip (they come and go with the busy count)."""
        while True:
            msg = self.recv(timeout)
            if msg is None or msg.get("type") != "idle":
                break
        assert msg is not None and msg.get("type") == type_, \
            f"expected {type_}, got {msg}; log:\n{self.output()}"
        return msg

    def start_ready(self):
        self.spawn()
        self.send_start()
        self.expect("started")
        self.ready = self.expect("ready")
        assert self.ready["idle"] is True
        return self

    def request(self, method, path, body=None):
        c = UnixHTTPConnection(self.sock_path)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def get_json(self, path):
        status, body = self.request("GET", path)
        assert status == 200, (status, body)
        return json.loads(body)

    def wait_exit(self, timeout=TIMEOUT):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker still running after {timeout} s; log:\n{self.output()}")

    def count_file(self):
        name = urllib.parse.quote(self.address, safe="") + ".count"
        path = os.path.join(self.state_dir, "data", name)
        with open(path) as f:
            return int(f.read().strip())

    def output(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def drain_idle(self, timeout=TIMEOUT):
        """Reads idle flips until the worker reports idle; returns the flips seen."""
        flips = []
        while True:
            msg = self.expect("idle", timeout)
            flips.append(msg["idle"])
            if msg["idle"]:
                return flips

    def close(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.ctrl:
            self.ctrl.close()
        if getattr(self, "log", None):
            self.log.close()


@pytest.fixture(params=["cpp", "python", "node"])
def kind(request):
    return request.param


@pytest.fixture
def code_set(tmp_path):
    """code_set({"hello.txt": "one"}): a CodeSet in a directory of its own under tmp_path."""
    base = tmp_path / "code"
    base.mkdir()
    return lambda files: CodeSet(str(base), files)


@pytest.fixture
def managers(tmp_path, kind):
    made = []

    def make(**kw):
        m = FakeManager(worker_command(kind), str(tmp_path), **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def assert_alternating(flips):
    for a, b in zip(flips, flips[1:]):
        assert a != b, flips


def test_lifecycle_counts_and_persists(managers):
    m = managers().start_ready()
    assert m.request("GET", "/") == (200, "0\n")
    assert m.drain_idle() == [False, True]
    for n in (1, 2, 3):
        assert m.request("POST", "/inc") == (200, f"{n}\n")
        assert m.drain_idle() == [False, True]
    status, body = m.request("GET", "/start")
    assert status == 200
    assert json.loads(body) == {"address": "doc:42", "start": {"greeting": "hi"}, "scripts": []}
    m.drain_idle()

    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    assert m.count_file() == 3  # the closer ran

    # A new worker for the same address starts from the persisted count.
    again = managers(name="w2").start_ready()
    assert again.request("GET", "/") == (200, "3\n")


def test_busy_holds_the_worker(managers):
    m = managers().start_ready()
    began = time.monotonic()
    assert m.request("GET", "/busy?ms=400")[0] == 200
    assert m.expect("idle")["idle"] is False
    assert m.expect("idle")["idle"] is True  # only when the busy hold ends, not with the response
    assert time.monotonic() - began >= 0.35
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_unknown_and_malformed_messages_are_ignored(managers):
    m = managers().start_ready()
    m.send({"type": "from-the-future", "x": [1, 2]})
    m.send(b"not json")
    m.send(b'{"no":"type"}')
    assert m.request("POST", "/inc") == (200, "1\n")
    assert_alternating(m.drain_idle())
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_second_worker_waits_for_the_lock(managers):
    first = managers(name="first").start_ready()
    assert first.request("POST", "/inc") == (200, "1\n")

    second = managers(name="second").spawn()
    second.send_start()
    assert second.quiet_for(0.7), "started while the first worker still holds the lock"

    first.send({"type": "shutdown"})
    assert first.wait_exit() == 0
    second.expect("started")
    second.expect("ready")
    # The first worker's closer ran before its lock was released.
    assert second.request("GET", "/") == (200, "1\n")


def test_kill9_releases_the_lock_at_once(managers):
    first = managers(name="first").start_ready()
    second = managers(name="second").spawn()
    second.send_start()
    assert second.quiet_for(0.5)
    os.killpg(first.proc.pid, signal.SIGKILL)
    assert first.wait_exit() == -signal.SIGKILL
    second.expect("started", timeout=2)
    second.expect("ready")


def test_shutdown_while_waiting_for_the_lock(managers):
    first = managers(name="first").start_ready()
    second = managers(name="second").spawn()
    second.send_start()
    assert second.quiet_for(0.3)
    second.send({"type": "shutdown"})
    assert second.wait_exit(timeout=2) == 0  # no need to wait for the lock to give up on it
    assert first.proc.poll() is None


def test_fatal_is_redacted(managers):
    m = managers().start_ready()
    try:
        m.request("GET", "/fatal")  # the response may or may not arrive
    except (http.client.HTTPException, OSError):
        pass
    while True:
        r, _, _ = select.select([m.ctrl], [], [], TIMEOUT)
        assert r, m.output()
        raw = m.ctrl.recv(1 << 20)
        assert raw, "EOF before fatal"
        assert b"secret-123" not in raw
        msg = json.loads(raw)
        if msg["type"] == "fatal":
            break
        assert msg["type"] == "idle"
    assert msg["error"] == {"message": "the counter failed", "code": "counter_failed"}
    assert m.wait_exit() == 1
    assert "secret-123" in m.output()  # the original goes to stderr only


def test_crash_exits_by_signal(managers):
    m = managers().start_ready()
    with pytest.raises((http.client.HTTPException, OSError)):
        m.request("GET", "/crash")
    assert m.wait_exit() == -signal.SIGABRT


def test_lost_link_stops_the_worker(managers):
    m = managers().start_ready()
    assert m.request("POST", "/inc") == (200, "1\n")
    m.ctrl.close()
    m.ctrl = None
    assert m.wait_exit() == 0
    assert m.count_file() == 1


def test_lost_link_before_start(managers):
    m = managers().spawn()
    m.ctrl.close()
    m.ctrl = None
    assert m.wait_exit() == 0


def test_sigterm_stops_gracefully(managers):
    m = managers().start_ready()
    assert m.request("POST", "/inc") == (200, "1\n")
    m.drain_idle()
    m.proc.send_signal(signal.SIGTERM)
    assert m.wait_exit() == 0
    assert m.count_file() == 1
    assert m.recv() is None  # no `fatal`, just the end of the link


def test_lock_path_that_cannot_be_opened_is_fatal(managers, tmp_path):
    m = managers(lock=str(tmp_path / "no-such-dir" / "x.lock")).spawn()
    m.send_start()
    msg = m.expect("fatal")
    assert msg["error"]["code"] == "lock_failed"
    assert str(tmp_path) not in json.dumps(msg)  # no paths cross
    assert m.wait_exit() == 1


def test_address_with_slashes_stays_in_the_data_dir(managers, tmp_path):
    m = managers(address="doc:../../escape").start_ready()
    assert m.request("POST", "/inc") == (200, "1\n")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    assert m.count_file() == 1
    assert os.listdir(os.path.join(m.state_dir, "data")) == ["doc%3A..%2F..%2Fescape.count"]


def test_address_arrives_in_its_wire_form_and_is_decoded(managers, tmp_path):
    """An address is bytes; `start` and CORRAL_ADDRESS carry its wire form (docs/worker-protocol.md:
    '%', invalid UTF-8 and control bytes as %XX). The worker decodes it: its data file is named
    after the bytes (each byte but [A-Za-z0-9._-] as %XX), and /start answers the wire form back."""
    wire = "doc:%FF%0D%0A50%25 x\u00e9"
    m = managers(address=wire).start_ready()
    status, body = m.request("GET", "/start")
    assert status == 200 and json.loads(body)["address"] == wire, body
    assert m.request("POST", "/inc") == (200, "1\n")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    assert os.listdir(os.path.join(m.state_dir, "data")) == [
        "doc%3A%FF%0D%0A50%25%20x%C3%A9.count"]


def test_long_address_gets_a_bounded_data_file(managers, tmp_path):
    wire = "doc:" + "%FF" * 250
    m = managers(address=wire, lock=os.path.join(str(tmp_path), "long.lock")).start_ready()
    assert m.request("POST", "/inc") == (200, "1\n")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    names = os.listdir(os.path.join(m.state_dir, "data"))
    assert len(names) == 1 and len(names[0]) <= 206 and "~" in names[0], names
    assert names[0].startswith("doc%3A%FF%FF"), names


# --- code and reload in place (docs/worker-protocol.md, "Code and reload") --------------------------


def assert_serves(m, code_set, hello):
    got = m.get_json("/code")
    assert got == {"version": code_set.version if code_set else None, "hello": hello,
                   "pid": m.proc.pid}, got


def assert_reloaded(msg, rid, code_set):
    assert msg["type"] == "reloaded" and msg["id"] == rid, msg
    assert msg["version"] == code_set.version, msg
    assert "report" in msg and "error" not in msg, msg


def test_start_with_code_serves_its_version(managers, code_set):
    v1 = code_set({"hello.txt": "one", "lib/app.py": "print(1)\n"})
    m = managers(code=v1).start_ready()
    assert m.ready.get("reload") is True
    assert_serves(m, v1, "one")
    assert m.get_json("/start")["scripts"] == v1.scripts
    # A kind without code: no version, no hello.
    plain = managers(name="plain", address="doc:43").start_ready()
    assert_serves(plain, None, None)


def test_a_set_of_thousands_of_files_comes_from_its_manifest(managers, code_set):
    files = {f"lib/m{i:04}.py": f"x = {i}\n" for i in range(3000)}
    files["hello.txt"] = "many"
    big = code_set(files)
    m = managers(code=code_set({"hello.txt": "one"})).start_ready()
    m.send_reload(1, big)
    assert_reloaded(m.expect_skipping_idle("reloaded"), 1, big)
    assert_serves(m, big, "many")
    assert m.get_json("/start")["scripts"] == big.scripts
    # Started on it, too.
    fresh = managers(code=big, name="fresh", address="doc:44").start_ready()
    assert fresh.get_json("/start")["scripts"] == big.scripts


def test_a_manifest_that_cannot_be_read_fails_the_reload_or_the_start(managers, code_set):
    v1, v2 = code_set({"hello.txt": "one"}), code_set({"hello.txt": "two"})
    m = managers(code=v1).start_ready()
    os.unlink(v2.manifest)
    m.send_reload(1, v2)
    reply = m.expect_skipping_idle("reloaded")
    assert reply["id"] == 1 and reply["version"] == v2.version, reply
    assert reply["error"]["code"] == "code_manifest_failed", reply
    assert_serves(m, v1, "one")  # the old set stays
    broken = managers(code=v2, name="broken", address="doc:45").spawn()
    broken.send_start()
    msg = broken.recv()
    assert msg and msg["type"] == "fatal" and msg["error"]["code"] == "code_manifest_failed", msg


def test_inline_scripts_of_an_older_manager_still_work(managers, code_set):
    v1 = code_set({"hello.txt": "one"})
    m = managers(code=v1).start_ready()
    v2 = code_set({"hello.txt": "two"})
    m.send({"type": "reload", "id": 1, "scripts": v2.scripts,
            "code": {"version": v2.version, "dir": v2.dir}})
    assert_reloaded(m.expect_skipping_idle("reloaded"), 1, v2)
    assert m.get_json("/start")["scripts"] == v2.scripts


def test_reload_answers_and_then_serves_the_new_set(managers, code_set):
    v1, v2 = code_set({"hello.txt": "one"}), code_set({"hello.txt": "two", "more.txt": "x"})
    m = managers(code=v1).start_ready()
    m.send_reload(1, v2)
    reloaded = m.expect_skipping_idle("reloaded")
    assert_reloaded(reloaded, 1, v2)
    assert reloaded["report"] == {"hello": "two"}  # what the examples' hook returns
    assert_serves(m, v2, "two")
    assert m.get_json("/start")["scripts"] == v2.scripts
    # A set without hello.txt.
    v3 = code_set({"other.txt": "3"})
    m.send_reload(2, v3)
    assert_reloaded(m.expect_skipping_idle("reloaded"), 2, v3)
    assert_serves(m, v3, None)
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_throwing_reload_keeps_the_old_set(managers, code_set):
    v1 = code_set({"hello.txt": "one"})
    bad = code_set({"hello.txt": "bad", "reload-fails": ""})
    m = managers(code=v1).start_ready()
    m.send_reload(1, bad)
    msg = m.expect_skipping_idle("reloaded")
    assert msg["id"] == 1 and msg["version"] == bad.version and "report" not in msg, msg
    assert msg["error"]["code"] == "reload_failed", msg
    assert bad.dir not in json.dumps(msg)  # the original error (with the path) stays on stderr
    assert "reload-fails" in m.output()
    assert_serves(m, v1, "one")
    # The next good set applies.
    v2 = code_set({"hello.txt": "two"})
    m.send_reload(2, v2)
    assert_reloaded(m.expect_skipping_idle("reloaded"), 2, v2)
    assert_serves(m, v2, "two")


def test_without_a_hook_reload_is_refused(managers, code_set):
    v1, v2 = code_set({"hello.txt": "one"}), code_set({"hello.txt": "two"})
    m = managers(code=v1, env={"CORRAL_NO_RELOAD": "1"}).start_ready()
    assert not m.ready.get("reload"), m.ready
    m.send_reload(1, v2)
    msg = m.expect("reloaded")  # no busy flip either: nothing ran
    assert msg == {"type": "reloaded", "id": 1, "version": v2.version,
                   "error": {"message": "This worker cannot reload in place.",
                             "code": "no_reload"}}, msg
    assert_serves(m, v1, "one")


def test_reload_before_ready_is_applied_after_ready(managers, code_set):
    v1, v2 = code_set({"hello.txt": "one"}), code_set({"hello.txt": "two"})
    m = managers(code=v1)
    # Hold the address's lock so that the worker waits after `start`, before `ready`.
    held = os.open(m.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        m.spawn()
        m.send_start()
        m.send_reload(1, v2)
        assert m.quiet_for(0.3), "answered while waiting for the lock"
    finally:
        os.close(held)
    m.expect("started")
    assert m.expect("ready").get("reload") is True
    assert_reloaded(m.expect_skipping_idle("reloaded"), 1, v2)
    assert_serves(m, v2, "two")


def test_reloads_back_to_back_are_answered_in_order(managers, code_set):
    sets = [code_set({"hello.txt": f"set {n}"}) for n in range(4)]
    m = managers(code=sets[0]).start_ready()
    bad = code_set({"reload-fails": ""})
    m.send_reload(1, sets[1])
    m.send_reload(2, bad)
    m.send_reload(3, sets[2])
    m.send_reload(4, sets[3])
    assert_reloaded(m.expect_skipping_idle("reloaded"), 1, sets[1])
    failed = m.expect_skipping_idle("reloaded")
    assert failed["id"] == 2 and failed["error"]["code"] == "reload_failed", failed
    assert_reloaded(m.expect_skipping_idle("reloaded"), 3, sets[2])
    assert_reloaded(m.expect_skipping_idle("reloaded"), 4, sets[3])
    assert_serves(m, sets[3], "set 3")


def test_idle_is_false_while_the_hook_runs(managers, code_set):
    v1 = code_set({"hello.txt": "one"})
    slow = code_set({"hello.txt": "slow", "reload-sleep-ms": "300"})
    m = managers(code=v1).start_ready()
    began = time.monotonic()
    m.send_reload(1, slow)
    assert m.expect("idle")["idle"] is False
    assert_reloaded(m.expect("reloaded"), 1, slow)  # the reply comes before the idle flip back
    assert m.expect("idle")["idle"] is True
    assert time.monotonic() - began >= 0.25


def test_requests_are_served_while_a_reload_runs(managers, code_set, kind):
    v1 = code_set({"hello.txt": "one"})
    slow = code_set({"hello.txt": "slow", "reload-sleep-ms": "1500"})
    m = managers(code=v1).start_ready()
    m.send_reload(1, slow)
    assert m.expect("idle")["idle"] is False  # the hook is running
    got = m.get_json("/code")
    hook_still_running = m.quiet_for(0)  # no `reloaded` yet
    if kind in SERVES_DURING_RELOAD:
        assert hook_still_running, "the request waited for the hook"
        assert got["version"] == v1.version and got["hello"] == "one", got
    else:
        # Read once the hook returned: the new set, whole.
        assert got["version"] == slow.version and got["hello"] == "slow", got
    assert_reloaded(m.expect_skipping_idle("reloaded"), 1, slow)
    assert_serves(m, slow, "slow")


def test_a_request_in_flight_survives_a_reload(managers, code_set):
    v1 = code_set({"hello.txt": "one"})
    v2 = code_set({"hello.txt": "two", "reload-sleep-ms": "200"})
    m = managers(code=v1).start_ready()
    result = {}

    def slow_request():
        result["answer"] = m.request("GET", "/slow?ms=400")

    t = threading.Thread(target=slow_request)
    t.start()
    try:
        assert m.expect("idle")["idle"] is False  # the request is in flight
        m.send_reload(1, v2)
        assert_reloaded(m.expect_skipping_idle("reloaded"), 1, v2)
    finally:
        t.join(TIMEOUT)
    assert result.get("answer") == (200, "slow 400 ms\n"), result
    assert_serves(m, v2, "two")


def test_reload_during_a_stop_is_not_answered(managers, code_set):
    v1, v2 = code_set({"hello.txt": "one"}), code_set({"hello.txt": "two"})
    m = managers(code=v1).start_ready()
    m.send({"type": "shutdown"})
    m.send_reload(1, v2)
    while True:
        msg = m.recv()
        assert msg is None or msg["type"] == "idle", msg
        if msg is None:
            break
    assert m.wait_exit() == 0


# --- a hanging worker and "why alive" (issue 14) -------------------------------------------------


def test_ready_says_ping_and_a_ping_is_answered(managers):
    m = managers().start_ready()
    assert m.ready["ping"] is True
    for rid in (1, 2, 7):
        m.send({"type": "ping", "id": rid})
        assert m.expect("pong") == {"type": "pong", "id": rid}
    m.send({"type": "ping"})  # no id: dropped, the worker goes on
    m.send({"type": "ping", "id": 8})
    assert m.expect("pong")["id"] == 8
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_ready_and_idle_carry_the_counts(managers):
    m = managers().start_ready()
    assert {k: m.ready[k] for k in ("requests", "upgraded", "busy")} == \
        {"requests": 0, "upgraded": 0, "busy": 0}
    assert m.request("GET", "/busy?ms=300")[0] == 200
    busy = m.expect("idle")
    assert busy["idle"] is False
    assert busy["requests"] + busy["busy"] >= 1 and busy["upgraded"] == 0, busy
    idle = m.expect("idle")
    assert idle == {"type": "idle", "idle": True, "requests": 0, "upgraded": 0, "busy": 0}
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_counts_while_busy_are_reported_at_most_once_a_second(managers):
    m = managers().start_ready()
    began = time.monotonic()
    assert m.request("GET", "/busy?ms=2600")[0] == 200  # busy, and its request is done
    flip = m.expect("idle")
    assert flip["idle"] is False
    stop = threading.Event()

    def requests():  # the request count changes all the time while the busy hold lasts
        while not stop.is_set() and time.monotonic() - began < 2.2:
            m.request("GET", "/")
            time.sleep(0.05)

    t = threading.Thread(target=requests)
    t.start()
    reports = []
    try:
        while True:
            msg = m.expect("idle")
            if msg["idle"]:
                break
            reports.append((time.monotonic(), msg))
    finally:
        stop.set()
        t.join(TIMEOUT)
    assert msg == {"type": "idle", "idle": True, "requests": 0, "upgraded": 0, "busy": 0}
    # The hold lasted ~2.6 s: one report a second at most (the counts changed all along), and at
    # least one that shows the busy count holding it.
    assert 1 <= len(reports) <= 3, reports
    assert any(r["busy"] == 1 for _, r in reports), reports
    times = [began] + [at for at, _ in reports]
    assert all(b - a >= 0.8 for a, b in zip(times, times[1:])), reports
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


# --- warm spares (issue 14, docs/worker-protocol.md "Warm spares") -----------------------------


def test_a_spare_says_standby_and_serves_the_address_it_is_bound_to(managers):
    m = managers(spare=True, address="doc:7")
    m.spawn()
    m.expect("standby")
    assert m.quiet_for(0.2)  # nothing more until `start`
    m.bind("doc%3A7")  # rename(2) of the listening socket's file: connects reach it there
    m.expect("started")
    assert m.expect("ready")["idle"] is True
    status, body = m.request("GET", "/start")
    assert status == 200
    assert json.loads(body) == {"address": "doc:7", "start": {"greeting": "hi"}, "scripts": []}
    assert not os.path.exists(os.path.join(m.sock_dir, "w.sock"))
    m.drain_idle()
    assert m.request("POST", "/inc") == (200, "1\n")
    m.drain_idle()
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
    assert m.count_file() == 1  # its data file is the address's, from `start`


def test_a_spare_bound_before_its_standby_takes_the_queued_start(managers):
    m = managers(spare=True)
    m.spawn()
    m.bind("doc%3A42")  # `start` waits in its socket while it starts up
    m.expect("standby")
    m.expect("started")
    m.expect("ready")
    assert m.request("GET", "/") == (200, "0\n")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_a_spare_stops_on_shutdown_without_a_start(managers):
    m = managers(spare=True)
    m.spawn()
    m.expect("standby")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0


def test_a_worker_started_for_an_address_sends_no_standby(managers):
    m = managers()
    m.spawn()
    m.send_start()
    m.expect("started")  # first: no standby
    m.expect("ready")
    m.send({"type": "shutdown"})
    assert m.wait_exit() == 0
