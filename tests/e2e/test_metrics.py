"""GET /metrics (src/control/metrics.h, docs/operate.md "Metrics"), on the real binary.

* A known load against two server processes and a worker kind (tests/workers/fake_worker.py):
  N requests with known codes (200s and 404s, on keep-alive and fresh connections), K first
  requests to new addresses and one more to a running worker. The scrape (admin listener)
  counts exactly that: requests by code, summed over both processes' blocks; K cold starts,
  K workers running, K start latencies and K first responses; one stop after `ctl stop`. The
  body passes `promtool check metrics` (Debian's prometheus package), and no label value holds
  an address or a path.
* OpenMetrics when Accept asks for it: its content type, counters typed by family name, the
  same counts, `# EOF` last (and, where python3-prometheus-client is installed, its strict
  OpenMetrics parser takes the body). The control socket serves the same route.
* A server process killed with SIGKILL: the respawn goes on counting in the same block, so no
  counter goes backwards; the dead process's open connection no longer counts; the slot's
  restart is counted.
* HTTP/3 (gtlsclient, tests/e2e/h3util.py): three requests on one QUIC connection are counted
  under proto="3", with their handshake, latencies and response bytes.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, control_get, control_request, poll

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")
PYTHON = "/usr/bin/python3"
PROMTOOL = "/usr/bin/promtool"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def config(kinds=True):
    text = "[admin]\nlisten = \"127.0.0.1:0\"\n"
    if kinds:
        env = {"FAKE_WORKER_HTTP": "1", "FAKE_WORKER_START": json.dumps({})}
        env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
        text += ("[workers.doc]\n"
                 f"command = {json.dumps([PYTHON, '-S', FAKE])}\n"
                 "routes = [\"/doc/{id}/*\"]\n"
                 f"env = {{ {env_toml} }}\n")
    return text


class Corral:
    def __init__(self, srv, state):
        self.srv, self.state = srv, state
        m = poll(lambda: re.search(r"admin_listening url=http://([\d.]+):(\d+)/", srv.log()),
                 ceiling(20), what="admin_listening", detail=srv.log)
        self.admin = (m.group(1), int(m.group(2)))
        poll(lambda: self.admin_get("/readyz")[0] == 200, ceiling(20), what="/readyz",
             detail=srv.log)

    def admin_get(self, path, headers=None):
        c = http.client.HTTPConnection(*self.admin, timeout=ceiling(10))
        try:
            c.request("GET", path, headers=headers or {})
            r = c.getresponse()
            return r.status, r.getheader("Content-Type"), r.read().decode()
        finally:
            c.close()

    def scrape(self, openmetrics=False):
        headers = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"} \
            if openmetrics else {}
        status, ctype, body = self.admin_get("/metrics", headers)
        assert status == 200, body
        assert ctype == (OPENMETRICS if openmetrics else PROMETHEUS)
        return body

    def get(self, path, conn=None):
        c = conn or http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=ceiling(20))
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        if conn is None:
            c.close()
        return r.status


def samples(body):
    """{(name, frozenset(labels.items())): value} of every sample line."""
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def value(body, name, **labels):
    return samples(body).get((name, frozenset(labels.items())), 0.0)


def requests_by_code(body):
    out = {}
    for (name, labels), v in samples(body).items():
        if name == "corral_http_requests_total":
            code = dict(labels)["code"]
            out[code] = out.get(code, 0) + v
    return out


def promtool(body):
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=ceiling(30))
    assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}"


def start(server_factory, tmp_path, *args, kinds=True):
    state = tmp_path / "state"
    srv = server_factory("--state-dir", str(state), *args, binary=CORRAL_BIN,
                         config=config(kinds))
    return Corral(srv, str(state))


def test_counts_match_a_known_load_and_promtool_accepts_them(server_factory, tmp_path):
    if not os.access(PROMTOOL, os.X_OK):
        pytest.fail(f"{PROMTOOL} is missing: scripts/deps.sh test installs Debian's prometheus")
    c = start(server_factory, tmp_path, "--processes", "2")
    before = c.scrape()
    promtool(before)
    assert requests_by_code(before) == {}, "nothing was sent yet"

    n_ok_keepalive, n_ok_fresh, n_missing, k = 12, 5, 4, 3
    keepalive = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=ceiling(20))
    for _ in range(n_ok_keepalive):
        assert c.get("/", keepalive) == 200
    keepalive.close()
    for _ in range(n_ok_fresh):
        assert c.get("/") == 200
    for i in range(n_missing):
        assert c.get(f"/no/such/path/{i}") == 404
    for i in range(k):  # K first requests, each to a new address: K starts
        assert c.get(f"/doc/k{i}/") == 200
    assert c.get("/doc/k0/") == 200  # the same worker again: no start

    want = {"200": n_ok_keepalive + n_ok_fresh + k + 1, "404": n_missing}
    # Counted when each response ends, which may be a moment after the client read it.
    poll(lambda: requests_by_code(c.scrape()) == want, ceiling(5),
         what=f"requests by code == {want}", detail=lambda: str(requests_by_code(c.scrape())))

    def workers_running():
        return value(c.scrape(), "corral_workers", kind="doc", status="running") == k

    poll(workers_running, ceiling(10), what=f"{k} doc workers running")
    body = c.scrape()
    promtool(body)
    assert requests_by_code(body) == want  # exactly: nothing more came
    total = sum(want.values())
    # GET /processes (and the status page) reads the same blocks: each process's requests.
    procs = control_get(c.state, "/processes")["processes"]
    assert sum(p["http_requests"] for p in procs) == total, procs
    assert all("connections_open" in p and "websockets_open" in p for p in procs), procs
    assert value(body, "corral_http_request_duration_seconds_count", proto="1.1") == total
    assert value(body, "corral_http_response_ttfb_seconds_count", proto="1.1") == total
    assert value(body, "corral_http_request_duration_seconds_bucket", proto="1.1",
                 le="+Inf") == total
    assert value(body, "corral_http_connections_accepted_total", proto="1.1") == \
        1 + n_ok_fresh + n_missing + k + 1
    assert value(body, "corral_http_request_bytes_total", proto="1.1") > 0
    assert value(body, "corral_http_response_bytes_total", proto="1.1") > 0
    assert value(body, "corral_worker_starts_total", kind="doc", **{"from": "cold"}) == k
    assert value(body, "corral_worker_starts_total", kind="doc", **{"from": "spare"}) == 0
    assert value(body, "corral_worker_start_duration_seconds_count", kind="doc",
                 **{"from": "cold"}) == k
    assert value(body, "corral_worker_first_response_seconds_count", kind="doc") == k
    assert value(body, "corral_proxy_errors_total", reason="unreachable") == 0
    assert value(body, "corral_processes", status="running") == 2
    assert sum(v for (name, _), v in samples(body).items()
               if name == "corral_worker_failures_total") == 0
    # Bounded labels: no address, no path, no client address.
    for (name, labels) in samples(body):
        for label, v in labels:
            assert "/" not in v and ":" not in v, (name, label, v)
            assert not re.match(r"\d+\.\d+\.\d+\.\d+$", v), (name, label, v)

    # A stop by the control API is counted by reason.
    status, _ = control_request(c.state, "POST", "/workers/doc%3Ak1/stop")
    assert status == 202
    poll(lambda: value(c.scrape(), "corral_worker_stops_total", kind="doc", reason="stop") == 1,
         ceiling(10), what="one stop counted")

    # OpenMetrics: the same counts, counters typed by their family, # EOF last.
    om = c.scrape(openmetrics=True)
    assert om.endswith("# EOF\n")
    assert "# TYPE corral_http_requests counter\n" in om
    assert "# TYPE corral_http_requests_total" not in om
    assert requests_by_code(om) == want
    try:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    except ImportError:
        text_string_to_metric_families = None
    if text_string_to_metric_families:  # strict: buckets, counts, names, # EOF
        families = {f.name: f for f in text_string_to_metric_families(om)}
        assert families["corral_http_requests"].type == "counter"
        assert families["corral_http_request_duration_seconds"].type == "histogram"

    # The control socket serves the same route.
    status, sock_body = control_request(c.state, "GET", "/metrics")
    assert status == 200
    assert requests_by_code(sock_body.decode()) == want


def test_a_respawned_process_goes_on_counting_and_its_dead_connections_do_not(server_factory,
                                                                               tmp_path):
    c = start(server_factory, tmp_path, kinds=False)
    for _ in range(5):
        assert c.get("/") == 200
    poll(lambda: requests_by_code(c.scrape()) == {"200": 5}, ceiling(5), what="5 counted")
    held = socket.create_connection((c.srv.host, c.srv.port), timeout=ceiling(10))
    held.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert held.recv(65536).startswith(b"HTTP/1.1 200")  # kept alive, and open
    poll(lambda: value(c.scrape(), "corral_http_connections_open", proto="1.1") == 1,
         ceiling(5), what="one connection open")
    before = c.scrape()
    assert requests_by_code(before) == {"200": 6}

    pid = control_get(c.state, "/processes")["processes"][0]["pid"]
    os.kill(pid, signal.SIGKILL)

    def respawned():
        p = (control_get(c.state, "/processes") or {}).get("processes", [{}])[0]
        return p.get("pid") not in (None, 0, pid) and p.get("status") == "running"

    poll(respawned, ceiling(20), what="slot 0 respawned", detail=c.srv.log)
    held.close()
    after = c.scrape()
    promtool(after)
    assert value(after, "corral_process_restarts_total", slot="0") == 1
    assert value(after, "corral_http_connections_open", proto="1.1") == 0
    # Nothing went backwards: the new process counts on in the dead one's block.
    for key, v in samples(before).items():
        name = key[0]
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
            assert samples(after).get(key, 0) >= v, key
    assert requests_by_code(after) == {"200": 6}
    assert c.get("/") == 200
    poll(lambda: requests_by_code(c.scrape()) == {"200": 7}, ceiling(5), what="7 counted")


def test_http3_requests_are_counted_under_proto_3(server_factory, tmp_path):
    from h3util import GTLSCLIENT, h3_fetch, start_h3
    if not os.access(GTLSCLIENT, os.X_OK):
        pytest.skip(f"{GTLSCLIENT} is missing (scripts/deps.sh test installs ngtcp2-client)")
    srv = start_h3(server_factory, 2, extra="[admin]\nlisten = \"127.0.0.1:0\"\n")
    c = Corral(srv, srv.state_dir)
    f = h3_fetch(srv.tls_port, "/hello", requests=3)
    assert f.ok, f.output[-3000:]
    poll(lambda: value(c.scrape(), "corral_http_requests_total", proto="3", code="200") == 3,
         ceiling(5), what="3 HTTP/3 requests counted",
         detail=lambda: str(requests_by_code(c.scrape())))
    body = c.scrape()
    promtool(body)
    assert requests_by_code(body) == {"200": 3}  # none over HTTP/1.1
    assert value(body, "corral_http_connections_accepted_total", proto="3") == 1
    assert value(body, "corral_http_response_ttfb_seconds_count", proto="3") == 3
    assert value(body, "corral_http_request_duration_seconds_count", proto="3") == 3
    assert value(body, "corral_http_response_bytes_total", proto="3") == 3 * len(b"hello")
