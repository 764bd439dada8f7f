"""A SIGHUP that changes a worker kind (docs/config.md, "SIGHUP"): what can change under running
workers is applied (here `idle`: a worker started under idle = 1h is stopped as idle within
seconds once the file says 1s), and each change that waits for a restart is named in a
`reload_ignored kind=... key=... reason="..."` warning (here `command`).
"""
import http.client
import json
import os
import signal

from conftest import CORRAL_BIN
from corral_test_util import ceiling, poll, wait_control_socket

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")
PYTHON = "/usr/bin/python3"


def config(idle, command):
    env = {"FAKE_WORKER_HTTP": "1", "FAKE_WORKER_START": json.dumps({})}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return ("[workers.doc]\n"
            f"command = {json.dumps(command)}\n"
            "routes = [\"/doc/{id}/*\"]\n"
            f"env = {{ {env_toml} }}\n"
            f"idle = \"{idle}\"\n")


def test_sighup_applies_idle_and_names_an_ignored_command(server_factory, tmp_path):
    state = tmp_path / "state"
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN,
                         config=config("1h", [PYTHON, "-S", FAKE]))
    wait_control_socket(str(state), ceiling(5), what="control socket")
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=ceiling(20))
    c.request("GET", "/doc/1/")
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 200
    srv.wait_log(r'worker_ready address="doc:1"', timeout=ceiling(10))

    # idle 1h -> 1s, and another argv[0] spelling of the same program (a command change).
    with open(tmp_path / "corral.toml", "w") as f:
        f.write(config("1s", [PYTHON, "-S", "-B", FAKE]))
    srv.signal(signal.SIGHUP)
    srv.wait_log(r'reload_applied kind=doc keys="idle"', timeout=ceiling(10))
    srv.wait_log(r'reload_ignored kind=doc key=command reason="[^"]+"', timeout=ceiling(5))
    # Under the old value it would live an hour; under the new one the idle check stops it.
    srv.wait_log(r'worker_stopping address="doc:1" pid=\d+ reason=idle',
                 timeout=ceiling(10))
