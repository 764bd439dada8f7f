"""`corral ctl cluster --config FILE` (docs/cluster.md) against a real etcd (Debian's etcd-server)
started here on free loopback ports with a scratch data directory, and killed at the end:

  * the nodes under `<name>/nodes/` with their advertise addresses, how many addresses each owns
    (`<name>/addresses/<address>/owner`) and how many are marked failed, as a table and as JSON;
    another cluster's keys (another name) are not counted;
  * no etcd answering is exit 69, a file without [cluster] is 78, no --config is 2.
"""
import base64
import json
import os
import subprocess
import urllib.request

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, free_port, poll

ETCD = "/usr/bin/etcd"


def b64(s):
    return base64.b64encode(s.encode()).decode()


@pytest.fixture
def etcd(tmp_path):
    if not os.access(ETCD, os.X_OK):
        pytest.skip("etcd-server is not installed")
    client, peer = free_port(), free_port()
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = open(tmp_path / "etcd.log", "w")
    proc = subprocess.Popen([ETCD, "--name=default", f"--data-dir={tmp_path}/etcd",
                             f"--listen-client-urls={c}", f"--advertise-client-urls={c}",
                             f"--listen-peer-urls={p}", f"--initial-advertise-peer-urls={p}",
                             f"--initial-cluster=default={p}", "--log-level=error"],
                            stdout=log, stderr=log)

    def healthy():
        try:
            with urllib.request.urlopen(c + "/health", timeout=1) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    try:
        poll(healthy, ceiling(15), "etcd's /health")
        yield c
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()


def put(endpoint, key, value):
    body = json.dumps({"key": b64(key), "value": b64(value)}).encode()
    with urllib.request.urlopen(urllib.request.Request(endpoint + "/v3/kv/put", data=body),
                                timeout=5) as r:
        assert r.status == 200


def ctl(*args):
    return subprocess.run([CORRAL_BIN, "ctl", "cluster", *args], capture_output=True, text=True,
                          timeout=ceiling(20))


def write_config(tmp_path, endpoint, name="demo"):
    path = tmp_path / "corral.toml"
    path.write_text(f'[cluster]\netcd = ["{endpoint}"]\nname = "{name}"\nnode = "n1"\n')
    return str(path)


def test_lists_nodes_and_what_they_own(etcd, tmp_path):
    put(etcd, "demo/nodes/n1", "10.0.0.1:8080")
    put(etcd, "demo/nodes/n2", "10.0.0.2:8080")
    put(etcd, "demo/addresses/doc1/owner", "n1")
    put(etcd, "demo/addresses/doc2/owner", "n1")
    put(etcd, "demo/addresses/doc3/owner", "n2")
    put(etcd, "demo/addresses/doc4/failed", '{"node":"n2","reason":"exit 1"}')
    put(etcd, "other/nodes/n9", "10.0.0.9:8080")
    put(etcd, "other/addresses/x/owner", "n9")
    config = write_config(tmp_path, etcd)

    r = ctl("--config", config)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NODE", "ADVERTISE", "ADDRESSES"]
    assert [l.split() for l in lines[1:3]] == [["n1", "10.0.0.1:8080", "2"],
                                               ["n2", "10.0.0.2:8080", "1"]]
    assert lines[3] == "1 address failed"
    assert len(lines) == 4

    j = json.loads(ctl("--config", config, "--json").stdout)
    assert j == {"name": "demo", "failed": 1,
                 "nodes": [{"node": "n1", "advertise": "10.0.0.1:8080", "addresses": 2},
                           {"node": "n2", "advertise": "10.0.0.2:8080", "addresses": 1}]}


def test_refusals(tmp_path):
    # Nothing listens on the port: exit 69, one line naming etcd.
    config = write_config(tmp_path, f"http://127.0.0.1:{free_port()}")
    r = ctl("--config", config)
    assert r.returncode == 69
    assert r.stdout == ""
    assert "ctl cluster: etcd (http://127.0.0.1:" in r.stderr
    plain = tmp_path / "plain.toml"
    plain.write_text('listen = "127.0.0.1:8080"\n')
    r = ctl("--config", str(plain))
    assert r.returncode == 78
    assert "no [cluster] section" in r.stderr
    assert ctl().returncode == 2
