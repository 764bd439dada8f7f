"""A warm spare that dies while it is being bound (docs/process-model.md, "Warm spares") is no
failure of the address, on the real binary: the first spare to read its `start` exits before
`started` (tests/workers/fake_worker.py with FAKE_WORKER_SPARE_DIES, the event that makes the
race certain), and the request is still answered 200 by another spare or a fork, with
`worker_spare_lost` in the log and no `worker_failed`.
"""
import http.client
import json
import os

from conftest import CORRAL_BIN
from corral_test_util import ceiling, ctl_json, poll, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")


def test_a_spare_that_dies_while_bound_is_replaced_and_the_request_served(server_factory,
                                                                           tmp_path):
    died = str(tmp_path / "spare-died")
    state = tmp_path / "state"
    env = {"FAKE_WORKER_HTTP": "1", "FAKE_WORKER_SPARE_DIES": died}
    config = ("[workers.s]\n"
              f"command = {json.dumps(['/usr/bin/python3', '-S', FAKE])}\n"
              'routes = ["/s/{id}/*"]\n'
              "spares = 1\n"
              "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }\n")
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    wait_control_socket(str(state), ceiling(5), what="control socket")

    def standby():
        return [e for e in ctl_json(str(state), "workers").values()
                if e.get("spare") and e["status"] == "standby"]
    spare = poll(standby, ceiling(20), what="a spare in standby")[0]["pid"]
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=ceiling(20))
    c.request("GET", "/s/a/")
    r = c.getresponse()
    assert (r.status, r.read()) == (200, b"hello s:a\n"), srv.log()[-3000:]
    c.close()
    assert os.path.exists(died)  # the bound spare did die at its `start`
    entry = ctl_json(str(state), "workers")["s:a"]
    assert entry["status"] == "running" and entry["pid"] != spare, entry
    log = srv.log()
    assert 'worker_spare_lost address="s:a"' in log, log[-3000:]
    assert "worker_failed" not in log, log[-3000:]
