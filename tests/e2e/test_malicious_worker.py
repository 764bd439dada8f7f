"""A worker that breaks HTTP (tests/workers/malicious_worker.py), through the real binary: what the
proxy lets reach a client (docs/worker-protocol.md, "What the proxy does with a broken response").

  * one response too many (/double: two responses for one request; /204extra: a 204 followed by
    a whole response) while other clients ask /headers at the same moment, many rounds: every
    client gets the answer to its own request, never the extra one nor another client's, with
    the worker echoing Corral-Seq (its connections are pipelined) and without (they are not);
  * a truncated body (/cutchunk, /nolastchunk, /shortcl): the client's connection closes at once
    and the message stays incomplete (no last chunk, fewer bytes than its Content-Length);
  * fields named by a Connection field are dropped both ways (/hop; a client's own);
  * a transfer coding other than chunked (/gzipchunked) is 502;
  * a worker whose accept queue is full is waited for, not answered 502; past the response
    timeout the client gets 503 with Retry-After and the log says worker_busy.

Every wait is bounded and polls an observable; none sleeps for a fixed time.
"""
import json
import os
import sys
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import (ceiling, control_request, parse_head, poll, read_response,
                              read_to_eof, wait_control_socket)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "workers", "malicious_worker.py")


@pytest.fixture
def evil(server_factory, tmp_path):
    """A `corral serve` whose kind `evil` ("/evil/{id}/*") runs the malicious worker."""

    def make(env=None, **keys):
        lines = ["[workers.evil]",
                 f"command = [{json.dumps(sys.executable or '/usr/bin/python3')}, "
                 f"{json.dumps(WORKER)}]",
                 'routes = ["/evil/{id}/*"]']
        if env:
            lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
                         + " }")
        lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        state = tmp_path / "state"
        srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN,
                             config="\n".join(lines) + "\n")
        wait_control_socket(str(state), ceiling(5), what="control socket")
        srv.state_dir = str(state)
        return srv

    return make


def get(path, extra=""):
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}\r\n".encode()


def read_one(sock, timeout=None):
    """(status, headers, body) of the next response on a keep-alive connection."""
    status, headers, body, rest = read_response(sock, timeout=timeout or ceiling(5))
    assert rest == b"", rest  # one request at a time on each client connection
    return status, headers, body


@pytest.mark.parametrize("echo", ["0", "1"], ids=["plain", "echoing"])
def test_an_extra_response_never_answers_another_client(evil, echo):
    srv = evil(env={"MALICIOUS_ECHO": echo})
    # The worker starts on the first request; from then on its answers are quick, so the proxy
    # pipelines what arrives in one loop round when it can tell the answers apart.
    c = srv.connect()
    c.sendall(get("/evil/a/"))
    assert read_one(c, ceiling(20))[0] == 200
    clients = [srv.connect() for _ in range(5)]
    wrong = []
    for r in range(20):
        # Sent back to back, so that they reach the server process in one loop round, in an
        # order that turns each round: the faulty ones ahead of the others and behind them.
        requests = [get("/evil/a/headers", f"X-Client: c{i}-r{r}\r\n") for i in range(3)]
        requests += [get("/evil/a/double"), get("/evil/a/204extra")]
        for k in range(5):
            clients[(k + r) % 5].sendall(requests[(k + r) % 5])
        for i, s in enumerate(clients[:3]):
            status, _, body = read_one(s)
            mine = f"c{i}-r{r}"
            if status != 200 or json.loads(body).get("x-client") != mine:
                wrong.append((mine, status, body[:120]))
        status, _, body = read_one(clients[3])
        if (status, body) != (200, b'{"first": true}'):
            wrong.append(("double", status, body[:120]))
        status, _, body = read_one(clients[4])
        if (status, body) != (204, b""):
            wrong.append(("204extra", status, body[:120]))
    assert not wrong, f"{len(wrong)} of 100 answers were not the client's own: {wrong[:5]}"
    if echo == "1":
        # The worker echoes Corral-Seq: its connections were pipelined on, so the extra answers
        # were refused by their Corral-Seq, not only by coming when nothing was asked.
        def pipelined():  # the server process reports every second
            status, body = control_request(srv.state_dir, "GET", "/processes", 5)
            reports = [p["proxy"] for p in json.loads(body)["processes"] if p.get("proxy")]
            return status == 200 and reports and reports[0]["pipelined"] > 0
        poll(pipelined, ceiling(5), what="pipelined requests in the proxy report")


@pytest.mark.parametrize("path", ["/cutchunk", "/nolastchunk", "/shortcl"])
def test_a_truncated_body_closes_the_client_connection_at_once(evil, path):
    srv = evil()
    c = srv.connect()
    c.sendall(get("/evil/t/"))  # the worker's start is not what this measures
    assert read_one(c, ceiling(20))[0] == 200
    began = time.monotonic()
    c.sendall(get("/evil/t" + path))
    got = read_to_eof(c, timeout=ceiling(5))  # raises if the connection stays open
    took = time.monotonic() - began
    head, _, body = got.partition(b"\r\n\r\n")
    status_line, headers = parse_head(head)
    assert status_line.split()[1] == "200", got
    assert took < ceiling(3), took  # at once, not after an idle timeout (60 s)
    if path == "/shortcl":
        assert headers["content-length"] == "100", headers
        assert body == b"0123456789", body
    else:
        assert headers["transfer-encoding"] == "chunked", headers
        assert not body.endswith(b"0\r\n\r\n"), body  # never completed by a last chunk
        assert b"hello" in body, body  # what came was passed on


def test_fields_named_by_connection_stop_at_the_proxy_both_ways(evil):
    srv = evil()
    c = srv.connect()
    c.sendall(get("/evil/h/hop"))
    status, headers, body = read_one(c, ceiling(20))
    assert (status, body) == (200, b"ok"), (status, body)
    assert headers.get("x-kept") == "yes", headers
    assert "x-secret" not in headers and "close-not" not in headers, headers
    # A client's Connection field names its own hop-by-hop fields: the worker never sees them.
    c.sendall(get("/evil/h/headers", "Connection: keep-alive, X-Private\r\nX-Private: mine\r\n"
                                     "X-Public: yours\r\n"))
    status, _, body = read_one(c)
    seen = json.loads(body)
    assert status == 200 and seen.get("x-public") == "yours", (status, seen)
    assert "x-private" not in seen and "connection" not in seen, seen


def test_a_transfer_coding_other_than_chunked_is_502(evil):
    srv = evil()
    c = srv.connect()
    c.sendall(get("/evil/g/gzipchunked"))
    status, headers, body = read_one(c, ceiling(20))
    assert status == 502, (status, headers, body)
    assert "gzip" not in headers.get("transfer-encoding", ""), headers
    # The worker's next answer on a new connection is fine.
    c.sendall(get("/evil/g/"))
    assert read_one(c)[:3:2] == (200, b"ok")


def concurrent_gets(srv, path, n):
    """n clients send GET `path` at once; returns their (status, headers, body) in order."""
    socks = [srv.connect(timeout=ceiling(20)) for _ in range(n)]
    for s in socks:
        s.sendall(get(path))
    out = [None] * n

    def read(i):
        try:
            out[i] = read_one(socks[i], ceiling(20))
        except Exception as e:  # noqa: BLE001 - reported by the test
            out[i] = (None, {}, repr(e).encode())

    threads = [threading.Thread(target=read, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_full_accept_queue_is_waited_for_not_502(evil):
    # A backlog of 2: while the worker takes no connection, the third waiting connect fails
    # (EAGAIN on a Unix socket). The requests wait for room and are answered once it accepts.
    srv = evil(env={"MALICIOUS_BACKLOG": "2"})
    c = srv.connect()
    c.sendall(get("/evil/q/"))
    assert read_one(c, ceiling(20))[0] == 200
    c.sendall(get("/evil/q/pause?ms=1500"))
    assert read_one(c)[0] == 200
    answers = concurrent_gets(srv, "/evil/q/", 24)
    assert [a[0] for a in answers] == [200] * 24, [a[:3:2] for a in answers if a[0] != 200][:3]


def test_a_queue_full_past_the_response_timeout_is_503_with_retry_after(evil):
    srv = evil(env={"MALICIOUS_BACKLOG": "2"}, response_timeout="1s")
    c = srv.connect()
    c.sendall(get("/evil/z/"))
    assert read_one(c, ceiling(20))[0] == 200
    c.sendall(get("/evil/z/pause?ms=60000"))
    assert read_one(c)[0] == 200
    answers = concurrent_gets(srv, "/evil/z/", 12)
    statuses = [a[0] for a in answers]
    # Those that found room in the accept queue wait for a head that never comes (504); the
    # others never reached the worker: 503, come back later. None is a 502.
    assert set(statuses) <= {503, 504}, statuses
    assert 503 in statuses, statuses
    busy = [a for a in answers if a[0] == 503][0]
    assert busy[1].get("retry-after") == "1", busy
    assert json.loads(busy[2])["error"]["code"] == "worker_busy", busy
    srv.wait_log(r'worker_busy address="evil:z" method=GET', timeout=ceiling(5))
