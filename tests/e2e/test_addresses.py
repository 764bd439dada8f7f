"""Addresses are bytes (issue 11, defects 1, 9 and 12; docs/worker-protocol.md "Addresses are
bytes"): a route's {id} percent-decodes to any bytes but '/' and NUL, and the address made of it
crosses every JSON message (server process <-> supervisor, supervisor -> worker), the worker's
environment and Corral-Address header, log lines, file names and the control API losslessly, in
its wire form ('%' and what is not text as %XX).

What is checked, on the real binary:
  * the embedded default (`corral serve`, the notes demo on /note/{id}/*): `%ff`, the overlong
    `%C0%AE%C0%AE` and the surrogate `%ED%A0%80` each get the note page, the server process and
    the supervisor keep their pids, and the control API lists the addresses in their wire form;
  * a counter worker (the C++ example) echoes the address it was given (decoded from `start`,
    re-encoded): byte-exact for invalid UTF-8, controls, '%', spaces, and `corral ctl stop` takes
    the wire form back;
  * with two {param}s a ':' in one is 400 bad_address (it would make two paths one address);
  * log injection: `/counter/a%0d%0aX:y/` leaves no line starting with "X:y" in the supervisor's
    log nor in the kind's log; the value is there escaped (`\\x0d\\x0a`, `%0D%0A`);
  * long keys: 300 bytes and 250 bytes of %FF are served (no `lock_failed`), with bounded lock and
    socket names, and two long keys sharing a 250-byte prefix get two workers;
  * a state directory too long for a Unix socket path is refused at start, naming the limit.
"""
import http.client
import json
import os

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ctl, ctl_json, poll, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
NOTES_WORKER = os.environ.get(
    "CORRAL_NOTES_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "corral-notes-worker"))


def wire_encode(b):
    """The wire form of an address's bytes (docs/worker-protocol.md), as core::wire_encode."""
    out = []
    i = 0
    while i < len(b):
        n = 0
        for k in (1, 2, 3, 4):
            try:
                cp = ord(b[i:i + k].decode("utf-8"))
                n = k
                break
            except (UnicodeDecodeError, TypeError):
                continue
        if n == 0:
            out.append(f"%{b[i]:02X}")
            i += 1
            continue
        unsafe = cp < 0x20 or cp == 0x7F or 0x80 <= cp <= 0x9F or cp in (0x2028, 0x2029)
        if unsafe or cp == 0x25:
            out.extend(f"%{x:02X}" for x in b[i:i + n])
        else:
            out.append(b[i:i + n].decode("utf-8"))
        i += n
    return "".join(out)


def pct(b):
    """Every byte percent-encoded: a path segment for any bytes."""
    return "".join(f"%{x:02X}" for x in b)


class Corral:
    def __init__(self, srv, state_dir):
        self.srv = srv
        self.state_dir = state_dir
        wait_control_socket(state_dir, 10, what="control socket")
        self.supervisor = srv.proc.pid
        self.server_pids = self.processes()

    def get(self, path, timeout=20, method="GET"):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request(method, path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def ctl(self, *args):
        return ctl(self.state_dir, *args)

    def processes(self):
        return sorted(p["pid"] for p in ctl_json(self.state_dir, "processes")["processes"])

    def workers(self):
        return ctl_json(self.state_dir, "workers")

    def assert_nothing_died(self):
        assert self.srv.proc.poll() is None, self.srv.log()[-3000:]
        assert self.processes() == self.server_pids, self.srv.log()[-3000:]
        log = self.srv.log()
        for bad in ("terminate called", "type_error", "slot_exited", "AddressSanitizer",
                    "runtime error"):
            assert bad not in log, log[-3000:]


def start_counter(server_factory, tmp_path, extra="", routes=("/counter/{id}/*",)):
    """corral with the C++ example worker as kind `counter` on `routes` (`extra`: more lines of
    its [workers.counter] table); skips when the worker is not built."""
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    state = tmp_path / "state"
    config = ("[workers.counter]\n"
              f"command = [{json.dumps(CPP_WORKER)}]\n"
              f"routes = {json.dumps(list(routes))}\n" + extra)
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    return Corral(srv, str(state))


@pytest.fixture
def counter(server_factory, tmp_path):
    return start_counter(server_factory, tmp_path)


def test_default_service_survives_addresses_that_are_not_utf8(server_factory, tmp_path):
    """Defect 1: the notes demo of `corral serve` with no config; each address used to abort the
    server process with nlohmann's type_error, and the supervisor then stopped."""
    if not os.access(NOTES_WORKER, os.X_OK):
        pytest.skip(f"{NOTES_WORKER} is not built")
    state = str(tmp_path / "state")
    c = Corral(server_factory("--state-dir", state, binary=CORRAL_BIN), state)
    for raw in (b"\xff", b"\xc0\xae\xc0\xae", b"\xed\xa0\x80"):
        status, body = c.get("/note/" + pct(raw) + "/")
        assert status == 200, (raw, status, body[:300], c.srv.log()[-3000:])
        assert b"<html" in body.lower(), body[:300]
        c.assert_nothing_died()
    listed = c.workers()
    for raw in (b"\xff", b"\xc0\xae\xc0\xae", b"\xed\xa0\x80"):
        assert wire_encode(b"note:" + raw) in listed, listed
    assert "note:%FF" in listed and "note:%C0%AE%C0%AE" in listed and "note:%ED%A0%80" in listed
    assert "worker_failed" not in c.srv.log()


def test_address_bytes_reach_the_worker_losslessly(counter):
    c = counter
    cases = [b"\xff", b"\xc0\xae", b"\xed\xa0\x80", b"caf\xc3\xa9", b"50%", b"%41", b"a b",
             b"\x01\x7f", b"\xc2\x9b[31m", b"\xe2\x80\xa8", b"\xf4\x90\x80\x80", b"ok"]
    for raw in cases:
        status, body = c.get("/counter/" + pct(raw) + "/start")
        assert status == 200, (raw, status, body[:300], c.srv.log()[-3000:])
        # The worker library decoded `start`'s address; the example answers its wire form.
        assert json.loads(body)["address"] == wire_encode(b"counter:" + raw), (raw, body)
    listed = c.workers()
    for raw in cases:
        assert wire_encode(b"counter:" + raw) in listed, (raw, listed)
    assert "counter:ok" in listed and "counter:50%25" in listed and "counter:%FF" in listed
    # `corral ctl` takes the address back in the wire form it shows.
    r = c.ctl("stop", "counter:%FF")
    assert r.returncode == 0, r.stdout + r.stderr
    poll(lambda: "counter:%FF" not in c.workers(), 10, "counter:%FF stopped")
    # A malformed wire form is refused, not guessed at.
    r = c.ctl("stop", "counter:%G1")
    assert r.returncode != 0
    c.assert_nothing_died()


def test_a_colon_in_one_of_several_params_is_refused(server_factory, tmp_path):
    """With two {param}s the key is both joined by ':'; a ':' inside one would make two paths one
    address (x:y + z and x + y:z), so it is 400 bad_address and starts nothing. A route with one
    {param} keeps ':' as part of its key."""
    c = start_counter(server_factory, tmp_path, routes=("/counter/{id}/*", "/pair/{a}/{b}/*"))
    status, body = c.get("/pair/x/y/start")
    assert status == 200, (status, body[:300])
    assert json.loads(body)["address"] == "counter:x:y"
    for path in ("/pair/x:y/z/start", "/pair/x/y%3Az/start", "/pair/x%3ay/z/start"):
        status, body = c.get(path)
        assert status == 400, (path, status, body[:300])
        assert json.loads(body)["error"]["code"] == "bad_address", body
    assert "counter:x:y:z" not in c.workers()
    status, body = c.get("/counter/x:y:z/start")
    assert status == 200, (status, body[:300])
    assert json.loads(body)["address"] == "counter:x:y:z"
    c.assert_nothing_died()


def test_no_log_injection(counter):
    """Defect 9: a CR LF in an address reaches neither log raw."""
    c = counter
    status, _ = c.get("/counter/a%0d%0aX:y/")
    assert status == 200, c.srv.log()[-3000:]
    kind_log = os.path.join(c.state_dir, "logs", "counter.log")
    # The worker logs its start on stderr, which the manager prefixes with the address.
    poll(lambda: os.path.exists(kind_log) and "worker_ready" in open(kind_log, "rb").read().decode(
        "utf-8", "replace"), 10, "the worker's ready line in the kind's log")
    for path in (c.srv.log_path, kind_log):
        with open(path, "rb") as f:
            data = f.read()
        assert b"\r" not in data, (path, data[-2000:])
        for line in data.split(b"\n"):
            assert not line.startswith(b"X:y"), (path, line)
    sup = open(c.srv.log_path, "rb").read()
    assert b'address="counter:a\\x0d\\x0aX:y"' in sup, sup[-2000:]
    kind = open(kind_log, "rb").read()
    assert b"counter:a%0D%0AX:y " in kind, kind[-2000:]
    c.assert_nothing_died()


def test_long_keys_get_bounded_file_names(counter):
    """Defect 12 (long keys): a key over ~250 bytes used to fail the address (`lock_failed`)."""
    c = counter
    long_ascii = b"k" * 300
    long_ff = b"\xff" * 250
    prefix = b"p" * 250
    for raw in (long_ascii, long_ff, prefix + b"1", prefix + b"2"):
        status, body = c.get("/counter/" + pct(raw) + "/inc", method="POST")
        assert status == 200, (status, body[:300], c.srv.log()[-3000:])
    # Two addresses that share their readable prefix are two workers with their own counts.
    assert c.get("/counter/" + pct(prefix + b"1") + "/inc", method="POST")[1].strip() == b"2"
    assert c.get("/counter/" + pct(prefix + b"2") + "/")[1].strip() == b"1"
    listed = c.workers()
    for raw in (long_ascii, long_ff, prefix + b"1", prefix + b"2"):
        assert listed.get(wire_encode(b"counter:" + raw), {}).get("status") == "running", listed
    locks = os.listdir(os.path.join(c.state_dir, "locks"))
    sockets = os.listdir(os.path.join(c.state_dir, "sockets"))
    assert len(locks) == 4 and len(set(locks)) == 4, locks
    assert len(sockets) == 4, sockets
    for name in locks:
        assert len(name) <= 205 and "/" not in name, name
    for name in sockets:
        assert len(os.path.join(c.state_dir, "sockets", name)) < 108, name
    assert "lock_failed" not in c.srv.log() and "worker_failed" not in c.srv.log()
    c.assert_nothing_died()


def test_state_dir_too_long_for_sockets_is_refused(server_factory, tmp_path):
    """A state directory where not even a hashed socket name fits sun_path: the worker manager
    refuses it at start, saying why and what fits (it used to fail each address at its start),
    and a worker route answers 503 rather than anything worse."""
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    state = tmp_path / ("s" * max(1, 100 - len(str(tmp_path))))
    config = ("[workers.counter]\n"
              f"command = [{json.dumps(CPP_WORKER)}]\n"
              'routes = ["/counter/{id}/*"]\n')
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    srv.wait_log(r"workers_failed .*would not fit a Unix socket path \(107 bytes\); use a state "
                 r"directory of at most 75 bytes", timeout=10)
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
    c.request("GET", "/counter/a/")
    assert c.getresponse().status == 503
    c.close()
    assert srv.proc.poll() is None
