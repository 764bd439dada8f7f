"""Warm spares (issue 14, docs/process-model.md "Warm spares"): `[workers.<kind>] spares = N` keeps
N worker processes launched without an address, past their own setup (`standby`), and the first
request to a new address binds one instead of forking.

What is checked, on the real binary with the C++, the Python and the Node.js example workers:
  * two spares are listed by `corral ctl workers` (keys spare/counter/<n>, status standby) before
    any request, as live children of the supervisor running the worker's program;
  * the first request to a new address is answered by one of them (its pid, known before the
    request, is the one `GET /code` answers and `ctl workers` shows for the address), no
    `worker_starting` without `spare=true` is logged, and the spare is replaced (two spares again,
    the used pid not among them);
  * with `max_starting = 1`, two first requests at once are both served by spares (the second
    bind waits for the first one's `ready`);
  * SIGTERM of the supervisor stops the spares with the workers.
"""
import concurrent.futures
import json
import os
import shutil
import signal

import pytest

from conftest import CORRAL_BIN
from corral_test_util import alive, poll, wait_control_socket
from test_workers import CPP_WORKER, WORKERS, Corral, toml_str


@pytest.fixture(params=["py", "cpp", "node"])
def spared(request, server_factory, tmp_path):
    if request.param == "cpp" and not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    if request.param == "node" and not shutil.which(WORKERS["node"][0][0]):
        pytest.skip("no node")
    argv, marker = WORKERS[request.param]
    state = tmp_path / "state"
    config = "\n".join([
        "[workers]",
        "max_starting = 1",
        "[workers.counter]",
        f"command = [{', '.join(toml_str(a) for a in argv)}]",
        'routes = ["/counter/{id}/*"]',
        'idle = "5m"',
        "spares = 2",
    ]) + "\n"
    srv = server_factory("--state-dir", str(state), "--no-access-log", binary=CORRAL_BIN,
                         config=config)
    c = Corral(srv, str(state), marker)
    wait_control_socket(c.state_dir, 5, what="control socket")
    return c


def spares(c):
    """{key: entry} of the spares `corral ctl workers` lists."""
    return {k: e for k, e in c.ctl_workers().items() if e.get("spare")}


def wait_standby(c, n, without=()):
    """The pids of n spares in standby (none of them in `without`)."""
    def check():
        s = spares(c)
        pids = {e["pid"] for e in s.values() if e["status"] == "standby"}
        return pids if len(pids) == n and not pids & set(without) else None
    return poll(check, 20, what=f"{n} spares in standby",
                detail=lambda: f"workers={c.ctl_workers()}\nlog:\n{c.srv.log()[-3000:]}")


def code_pid(c, address_key):
    status, _, body = c.get(f"/counter/{address_key}/code")
    assert status == 200, (status, body)
    return json.loads(body)["pid"]


def test_first_requests_are_served_by_spares_which_are_replaced(spared):
    c = spared
    before = wait_standby(c, 2)
    for key, e in spares(c).items():
        assert key.startswith("spare/counter/") and ":" not in key, key
        assert e["kind"] == "counter", e
    assert before <= c.worker_pids(), (before, c.worker_pids())  # children running the worker

    pid = code_pid(c, "a1")
    assert pid in before, (pid, before)
    entry = c.ctl_workers()["counter:a1"]
    assert entry["status"] == "running" and entry["pid"] == pid, entry
    status, _, body = c.get("/counter/a1/")
    assert (status, body) == (200, b"0\n"), (status, body)

    after = wait_standby(c, 2, without={pid})
    assert len(after - before) == 1, (before, after)  # one new spare, the other one kept
    assert after <= c.worker_pids()

    pid2 = code_pid(c, "a2")
    assert pid2 in after, (pid2, after)
    log = c.srv.log()
    assert 'worker_spare_bound address="counter:a1"' in log, log[-3000:]
    assert 'worker_spare_bound address="counter:a2"' in log, log[-3000:]
    # Every start was a bind: no worker forked for an address.
    starts = [l for l in log.splitlines() if "worker_starting " in l]
    assert starts and all("spare=true" in l for l in starts), starts
    wait_standby(c, 2, without={pid, pid2})


def test_two_first_requests_at_once_with_one_start_place(spared):
    c = spared
    before = wait_standby(c, 2)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pids = list(pool.map(lambda k: code_pid(c, k), ["b1", "b2"]))
    assert set(pids) == before, (pids, before)
    wait_standby(c, 2, without=set(pids))


def test_sigterm_stops_the_spares(spared):
    c = spared
    before = wait_standby(c, 2)
    code_pid(c, "c1")
    wait_standby(c, 2)
    pids = c.worker_pids()
    c.srv.proc.send_signal(signal.SIGTERM)
    assert c.srv.proc.wait(timeout=20) == 0
    poll(lambda: not any(alive(p) for p in pids | before), 10, what="workers and spares gone")
