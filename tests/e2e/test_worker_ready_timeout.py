"""The ready timeout (docs/config.md `ready_timeout`, worker-protocol.md "Failure") on the real
binary, with a worker of the tests' own that takes its lock, says `started` and never `ready`
(tests/workers/fake_worker.py, mode never_ready; it also ignores SIGTERM, as a stuck setup would):

  * the requests waiting for it get 503 `ready_timeout` about `ready_timeout` (1 s) after its
    start, the address stays `failed` with that error in `corral ctl workers` (503 at once, no new
    fork) until `ctl retry`, and the worker is killed;
  * with `max_starting = 1` it does not hold the one start place past its timeout: another
    address queued behind it starts then and is served (before, it sat `queued` until its
    kind's start_timeout and got 503 start_limit);
  * `corral check` names a bad `ready_timeout`.
"""
import http.client
import json
import os
import subprocess
import threading
import time

from conftest import CORRAL_BIN
from corral_test_util import alive, ceiling, ctl, ctl_json, poll, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")
PYTHON = "/usr/bin/python3"


def kind(name, start, extra=""):
    env = {"FAKE_WORKER_HTTP": "1", "FAKE_WORKER_START": json.dumps(start)}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (f"[workers.{name}]\n"
            f"command = {json.dumps([PYTHON, '-S', FAKE])}\n"
            f"routes = [\"/{name}/{{id}}/*\"]\n"
            f"env = {{ {env_toml} }}\n" + extra)


def get(srv, path, timeout):
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def serve(server_factory, tmp_path):
    state = tmp_path / "state"
    config = ("[workers]\nmax_starting = 1\n" +
              kind("stuck", {"mode": "never_ready"}, 'ready_timeout = "1s"\n') +
              # Before the ready timeout, ok:* queued behind stuck:* until this, then 503.
              kind("ok", {}, 'start_timeout = "10s"\n'))
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    wait_control_socket(str(state), ceiling(5), what="control socket")
    srv.state_dir = str(state)
    return srv


def test_a_worker_that_never_gets_ready_fails_its_address_and_is_killed(server_factory, tmp_path):
    srv = serve(server_factory, tmp_path)
    answers = []

    def ask():
        t0 = time.monotonic()
        status, body = get(srv, "/stuck/a/", ceiling(20))
        answers.append((status, json.loads(body), time.monotonic() - t0))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ceiling(25))
    assert len(answers) == 2, srv.log()[-3000:]
    for status, body, took in answers:
        assert status == 503, (status, body)
        assert body["error"]["code"] == "ready_timeout", body
        assert took >= 0.9, took  # not before its bound
    pid = int(srv.wait_log(r'worker_starting address="stuck:a" pid=(\d+)').group(1))
    poll(lambda: not alive(pid), ceiling(5), what="the never-ready worker killed")
    entry = ctl_json(srv.state_dir, "workers")["stuck:a"]
    assert entry["status"] == "failed" and entry["error"]["code"] == "ready_timeout", entry
    srv.wait_log(r'worker_failed address="stuck:a" error="no `ready` within 1000 ms of `started`"')
    # Failed until retry: 503 at once, nothing forks.
    starts = srv.log().count("worker_starting ")
    t0 = time.monotonic()
    status, body = get(srv, "/stuck/a/", ceiling(5))
    assert status == 503 and json.loads(body)["error"]["code"] == "ready_timeout", body
    assert time.monotonic() - t0 < 0.9
    assert srv.log().count("worker_starting ") == starts
    assert ctl(srv.state_dir, "retry", "stuck:a").returncode == 0
    assert "stuck:a" not in ctl_json(srv.state_dir, "workers")


def test_a_never_ready_worker_holds_the_start_place_no_longer_than_its_timeout(
        server_factory, tmp_path):
    srv = serve(server_factory, tmp_path)
    stuck = []
    t = threading.Thread(target=lambda: stuck.append(get(srv, "/stuck/b/", ceiling(20))))
    t.start()
    poll(lambda: ctl_json(srv.state_dir, "workers").get("stuck:b", {}).get("status") == "starting",
         ceiling(10), what="stuck:b starting", detail=lambda: srv.log()[-3000:])
    status, body = get(srv, "/ok/c/", ceiling(30))
    assert (status, body) == (200, b"hello ok:c\n"), (status, body, srv.log()[-3000:])
    t.join(ceiling(20))
    assert stuck and stuck[0][0] == 503, stuck
    log = srv.log()
    assert "start_limit" not in log, log[-3000:]
    # ok:c started only once stuck:b had failed: its start place was the one stuck:b held.
    assert log.index('worker_failed address="stuck:b"') < log.index(
        'worker_starting address="ok:c"'), log[-3000:]


def test_check_names_a_bad_ready_timeout(tmp_path):
    def check(value):
        cfg = tmp_path / "corral.toml"
        cfg.write_text(kind("doc", {}, f"ready_timeout = {value}\n"))
        return subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True,
                              text=True, timeout=ceiling(30), stdin=subprocess.DEVNULL)

    r = check('"never"')
    assert r.returncode == 78 and "workers.doc.ready_timeout: 'never' is not a duration" in r.stderr
    r = check("0")
    assert r.returncode == 78 and "workers.doc.ready_timeout: must be more than 0" in r.stderr, r
    assert check('"90s"').returncode == 0
