"""`Expect: 100-continue` and interim responses through the worker proxy (issue 11, defect 6;
docs/http.md, docs/worker-protocol.md).

curl sends `Expect: 100-continue` by itself for a body over 1 MiB. The front answers it (its own
`100 Continue`, once the head passed its checks), reads the whole body, and proxies the request
without `Expect`; an upstream's interim responses (1xx) are read past, so the client always gets
the final one. Before the fix the proxy passed `Expect` on, the worker answered `100` itself, the
proxy took that for the final response, and curl never got the real one while the write was
applied.

Run on the real binary with real curl against three kinds: the C++ example worker (corral's own
HTTP server: a head ahead of a 2 MiB body gets its 100), the Python example worker
(http.server: any `Expect` gets its 100) and the fake worker that always sends 100 and 103
before its answer.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import CORRAL_BIN

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY_WORKER = os.path.join(REPO, "examples", "worker_python", "worker.py")
FAKE = os.path.join(REPO, "tests", "workers", "fake_worker.py")
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
PYTHON = sys.executable or "/usr/bin/python3"


def q(s):
    return json.dumps(s)


@pytest.fixture
def corral(server_factory, tmp_path):
    if not os.access(CPP_WORKER, os.X_OK):
        pytest.skip(f"{CPP_WORKER} is not built")
    config = f"""
[workers.cpp]
command = [{q(CPP_WORKER)}]
routes = ["/cpp/{{id}}/*"]
[workers.py]
command = [{q(PYTHON)}, {q(PY_WORKER)}]
routes = ["/py/{{id}}/*"]
[workers.interim]
command = [{q(PYTHON)}, "-S", {q(FAKE)}]
routes = ["/interim/{{id}}/*"]
env = {{ FAKE_WORKER_HTTP = "1", FAKE_WORKER_INTERIM = "1" }}
"""
    srv = server_factory("--state-dir", str(tmp_path / "state"), binary=CORRAL_BIN,
                         config=config)
    return srv


def curl(srv, path, *args):
    """curl -v to `path`; (status line and headers of every response, body, stderr)."""
    r = subprocess.run(["curl", "-sS", "-v", "--max-time", "15", "-o", "-", *args,
                        f"{srv.url}{path}"], capture_output=True, timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr.decode(errors="replace")[-3000:],
                               srv.log()[-3000:])
    err = r.stderr.decode(errors="replace")
    heads = [line[2:] for line in err.splitlines() if line.startswith("< HTTP/")]
    return heads, r.stdout, err


def test_big_body_curl_expects_100_and_gets_the_final_response(corral, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 << 19))  # 1.5 MiB: curl adds Expect: 100-continue itself
    heads, body, err = curl(corral, "/cpp/e1/inc", "--data-binary", f"@{big}")
    assert "> Expect: 100-continue" in err, err  # the case under test
    assert heads[0].startswith("HTTP/1.1 100"), heads  # the front's own interim
    assert heads[-1].startswith("HTTP/1.1 200"), heads
    assert [h for h in heads if h.startswith("HTTP/1.1 1")] == [heads[0]], heads
    assert body == b"1\n"
    # applied once, and the worker serves on
    heads, body, _ = curl(corral, "/cpp/e1/")
    assert body == b"1\n", heads


def test_small_body_with_expect_gets_the_final_response(corral):
    # http.server answers any Expect with its own 100: it must not see one.
    heads, body, err = curl(corral, "/py/e2/inc", "-H", "Expect: 100-continue",
                            "--data-binary", "x" * 100)
    assert "> Expect: 100-continue" in err, err
    assert heads[-1].startswith("HTTP/1.1 200"), heads
    assert body == b"1\n"
    # the same to the C++ worker, and a body curl sends without waiting (Expect: empty)
    for extra in (["-H", "Expect: 100-continue"], []):
        heads, body, _ = curl(corral, "/cpp/e2/inc", *extra, "--data-binary", "y" * 100)
        assert heads[-1].startswith("HTTP/1.1 200") and body.endswith(b"\n"), (heads, body)
    assert curl(corral, "/cpp/e2/")[1] == b"2\n"


def test_a_worker_that_sends_interim_responses_itself(corral):
    # The fake worker answers every request with 100, then 103, then 200: the client sees only
    # the 200 (and the front's own 100 when it asked for one).
    heads, body, _ = curl(corral, "/interim/i1/x")
    assert heads == ["HTTP/1.1 200 OK"], heads
    assert body == b"hello interim:i1\n"
    heads, body, _ = curl(corral, "/interim/i1/y", "-H", "Expect: 100-continue",
                          "--data-binary", "z" * 2000)
    assert heads[-1] == "HTTP/1.1 200 OK" and len(heads) <= 2, heads
    assert body == b"hello interim:i1\n"
    # keep-alive: several on one curl connection, each with its own final response
    r = subprocess.run(["curl", "-sS", "--max-time", "15", f"{corral.url}/interim/i1/a",
                        f"{corral.url}/interim/i1/b", f"{corral.url}/py/e3/"],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"hello interim:i1\nhello interim:i1\n0\n", r.stdout
