"""The admin listener (src/control/admin.h, docs/operate.md "The admin listener"): the control API
over TCP, its access rule, and the health checks.

What is checked, on the real binary, on loopback addresses only:
  * a loopback peer reads the control API (GET /processes) and /healthz; a foreign Host (a
    DNS-rebinding page) is refused by admission;
  * a POST needs the listener's own Origin (or Sec-Fetch-Site: same-origin): a cross-origin
    POST and a bare one are 403 and change nothing, a same-origin one stops the worker;
  * token mode: `allow = ["127.0.0.2/32"]` admits only that peer, and only with the bearer token:
    127.0.0.1 is 403 even with the token, 127.0.0.2 is 401 without it and with a wrong one, 200
    with it; each refusal is logged `admin_refused peer=... reason=...`. (A peer that is not
    loopback at all is the same check with another address: src/control/admin_test.cc.)
  * `corral check` refuses `allow` without a readable token file;
  * /readyz: 200 once every slot listens, 503 naming the slot while one cannot start.
"""
import http.client
import json
import os
import re
import socket
import subprocess

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, poll

CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))


class Admin:
    def __init__(self, srv):
        self.srv = srv
        m = poll(lambda: re.search(r"admin_listening url=http://([\d.]+):(\d+)/", srv.log()),
                 ceiling(20), what="admin_listening", detail=srv.log)
        self.host, self.port = m.group(1), int(m.group(2))

    def request(self, method, path, headers=None, source="127.0.0.1", body=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=ceiling(10),
                                       source_address=(source, 0))
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    @property
    def origin(self):
        return f"http://{self.host}:{self.port}"


def start(server_factory, tmp_path, admin_table="listen = \"127.0.0.1:0\"\n", kinds="",
          args=(), env=None, state="state"):
    config = "[admin]\n" + admin_table + kinds
    srv = server_factory("--state-dir", str(tmp_path / state), *args, binary=CORRAL_BIN,
                         config=config, env=env)
    return Admin(srv)


def test_a_loopback_peer_reads_the_control_api(server_factory, tmp_path):
    a = start(server_factory, tmp_path)
    status, body = a.request("GET", "/processes")
    assert status == 200, body
    assert json.loads(body)["processes"][0]["status"] in ("starting", "running")
    assert a.request("GET", "/healthz") == (200, b"ok\n")
    # A page on another name that resolves to 127.0.0.1 (DNS rebinding): refused by admission.
    status, _ = a.request("GET", "/processes", headers={"Host": f"evil.example:{a.port}"})
    assert status == 403
    # A GET needs no Origin; a cross-origin read is the browser's to refuse (no CORS headers).
    status, _ = a.request("GET", "/processes", headers={"Origin": "http://evil.example"})
    assert status == 200


def test_a_cross_origin_post_is_refused_and_a_same_origin_one_accepted(server_factory, tmp_path):
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    kinds = ("[workers.counter]\n"
             f"command = [{json.dumps(CPP_WORKER)}]\n"
             'routes = ["/counter/{id}/*"]\n')
    a = start(server_factory, tmp_path, kinds=kinds)
    c = http.client.HTTPConnection("127.0.0.1", a.srv.port, timeout=ceiling(20))
    c.request("GET", "/counter/a/")
    assert c.getresponse().status == 200
    c.close()
    stop = "/workers/counter%3Aa/stop"

    def running():
        status, body = a.request("GET", "/workers")
        return json.loads(body).get("counter:a", {}).get("status") == "running"

    poll(running, ceiling(10), what="counter:a running")
    for headers in ({"Origin": "http://evil.example"},
                    {"Origin": f"http://localhost:{a.port + 1}"},
                    {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"},
                    {}):
        status, body = a.request("POST", stop, headers=headers)
        assert status == 403, (headers, status, body)
        assert body.count(b"\n") == 1, body
    assert running()
    assert "admin_refused peer=127.0.0.1" in a.srv.log()
    status, body = a.request("POST", stop, headers={"Origin": a.origin})
    assert status == 202, body
    poll(lambda: "counter:a" not in json.loads(a.request("GET", "/workers")[1]), ceiling(10),
         what="counter:a stopped")
    # Sec-Fetch-Site alone (a browser that sends no Origin) passes the guard too.
    status, body = a.request("POST", stop, headers={"Sec-Fetch-Site": "same-origin"})
    assert status == 404, body


def test_allow_admits_only_those_peers_and_only_with_the_token(server_factory, tmp_path):
    token = tmp_path / "admin.token"
    token.write_text("correct-horse-battery\n")
    os.chmod(token, 0o600)
    a = start(server_factory, tmp_path,
              admin_table=f'listen = "127.0.0.1:0"\nallow = ["127.0.0.2/32"]\n'
                          f'token_file = "{token}"\n')
    good = {"Authorization": "Bearer correct-horse-battery"}
    status, body = a.request("GET", "/processes", headers=good, source="127.0.0.1")
    assert status == 403, body
    status, body = a.request("GET", "/processes", source="127.0.0.2")
    assert status == 401, body
    status, body = a.request("GET", "/processes", source="127.0.0.2",
                             headers={"Authorization": "Bearer correct-horse-batterz"})
    assert status == 401, body
    status, body = a.request("GET", "/processes", headers=good, source="127.0.0.2")
    assert status == 200, body
    # With the token a POST needs no Origin (it reaches the router: no worker routes here).
    status, body = a.request("POST", "/workers/x%3A1/stop", headers=good, source="127.0.0.2")
    assert status == 404, body
    log = a.srv.log()
    assert re.search(r"admin_refused peer=127\.0\.0\.1 status=403 reason=\"peer is outside", log)
    assert re.search(r"admin_refused peer=127\.0\.0\.2 status=401 reason=\"bearer token req", log)
    assert re.search(r"admin_refused peer=127\.0\.0\.2 status=401 reason=\"wrong bearer", log)
    assert "correct-horse" not in log


@pytest.mark.parametrize("table,problem", [
    ('allow = ["10.0.0.0/8"]\n', "admin.token_file: required with admin.allow"),
    ('allow = ["10.0.0.0/8"]\ntoken_file = "missing.token"\n', "missing.token"),
    ('allow = ["10.0.0.1/8"]\ntoken_file = "t"\n', "admin.allow[0]"),
])
def test_check_refuses_allow_without_a_token(tmp_path, table, problem):
    (tmp_path / "t").write_text("x\n")
    cfg = tmp_path / "corral.toml"
    cfg.write_text('[admin]\nlisten = "127.0.0.1:0"\n' + table)
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=ceiling(10))
    assert r.returncode == 78, r.stdout + r.stderr
    assert problem in r.stderr, r.stderr


def test_readyz_names_the_slot_that_is_not_up(server_factory, tmp_path, no_core_dumps):
    a = start(server_factory, tmp_path, args=("--processes", "2"))
    poll(lambda: a.request("GET", "/readyz") == (200, b"ready\n"), ceiling(20), what="ready",
         detail=a.srv.log)
    # Slot 1 aborts at every start (a test build's fault injection): never ready.
    crashing = start(server_factory, tmp_path, args=("--processes", "2"), state="state2",
                     env={"CORRAL_TEST_CRASH_AT_START": "1"})

    def slot1_down():
        status, body = crashing.request("GET", "/readyz")
        return status == 503 and re.fullmatch(rb"slot 1 is (starting|backoff|exited)\n", body)

    poll(slot1_down, ceiling(10), what="503 naming slot 1", detail=crashing.srv.log)
    assert crashing.request("GET", "/healthz") == (200, b"ok\n")
    assert a.request("GET", "/readyz") == (200, b"ready\n")
