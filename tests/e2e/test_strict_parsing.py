"""Strict HTTP/1.1 parsing against the real binary (`corral serve`, RFC 9112 §2.2, §2.3, §3, §6):
a request line that is not exactly `method SP request-target SP HTTP-version CRLF` (stray
whitespace, the HTTP/0.9 form, a fourth element), an HTTP-version that is not `HTTP/` DIGIT `.`
DIGIT, a Transfer-Encoding field that is empty or applies chunked more than once: each is 400 and
close; a well-formed version other than 1.0 and 1.1 is 505; a Content-Length above max_body is 413
as soon as the head is in (the body is never waited for: body_ms is 30 s here).

Each case is sent whole, byte by byte (one send per byte), after a good keep-alive request whose
response was read, and pipelined behind one. Each time the answer carries the exact status and
`Connection: close`, nothing follows it, the server closes the connection, and a fresh connection
is still served. One server serves every case of this file (a case never changes its state).
"""
import time

import pytest

from conftest import CORRAL_BIN, start_server
from corral_test_util import Prefixed, expect_closed, read_response, send_refusable

HOST = b"Host: localhost\r\n"
GOOD = b"GET / HTTP/1.1\r\n" + HOST + b"\r\n"
MAX_BODY = 1000
CONFIG = (f"[limits]\nmax_body = {MAX_BODY}\n"
          "[timeouts]\nclose_ms = 300\nbody_ms = 30000\nheader_ms = 30000\n")


def get(line, headers=b""):
    return line + b"\r\n" + HOST + headers + b"\r\n"


def post(headers, body=b""):
    return b"POST / HTTP/1.1\r\n" + HOST + headers + b"\r\n" + body


CASES = [
    # The request line: one SP between its three elements, nothing else.
    pytest.param(get(b"GET  / HTTP/1.1"), 400, id="two-spaces-after-method"),
    pytest.param(get(b"GET /  HTTP/1.1"), 400, id="two-spaces-before-version"),
    pytest.param(get(b"GET / HTTP/1.1 "), 400, id="trailing-space"),
    pytest.param(get(b" GET / HTTP/1.1"), 400, id="leading-space"),
    pytest.param(get(b"GET\t/ HTTP/1.1"), 400, id="tab-after-method"),
    pytest.param(get(b"GET /\tHTTP/1.1"), 400, id="tab-before-version"),
    pytest.param(get(b"GET / HTTP/1.1\t"), 400, id="trailing-tab"),
    pytest.param(b"GET /\r\n", 400, id="http-0.9-form"),
    pytest.param(get(b"GET /"), 400, id="no-version-with-headers"),
    pytest.param(get(b"GET / HTTP/1.1 extra"), 400, id="fourth-element"),
    pytest.param(get(b"GET /a b HTTP/1.1"), 400, id="space-in-target"),
    # The HTTP-version: malformed is 400, well-formed but unsupported is 505.
    pytest.param(get(b"GET / HTTP/1.10"), 400, id="version-1.10"),
    pytest.param(get(b"GET / HTTP/01.1"), 400, id="version-01.1"),
    pytest.param(get(b"GET / http/1.1"), 400, id="version-lowercase"),
    pytest.param(get(b"GET / HTTP/1"), 400, id="version-1"),
    pytest.param(get(b"GET / HTTP/1.x"), 400, id="version-1.x"),
    pytest.param(get(b"GET / HTTP/2.0"), 505, id="version-2.0"),
    pytest.param(get(b"GET / HTTP/0.9"), 505, id="version-0.9"),
    pytest.param(get(b"GET / HTTP/3.1"), 505, id="version-3.1"),
    # Transfer-Encoding the body length cannot be read from.
    pytest.param(post(b"Transfer-Encoding:\r\n"), 400, id="TE-empty"),
    pytest.param(post(b"Transfer-Encoding: \r\nContent-Length: 5\r\n", b"hello"), 400,
                 id="TE-blank-with-CL"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding:\r\n", b"0\r\n\r\n"), 400,
                 id="TE-chunked-then-empty"),
    pytest.param(post(b"Transfer-Encoding: chunked, chunked\r\n", b"0\r\n\r\n"), 400,
                 id="TE-chunked-twice-one-field"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                      b"0\r\n\r\n"), 400, id="TE-chunked-twice-two-fields"),
    # A declared body over max_body: 413 on the head alone.
    pytest.param(post(b"Content-Length: %d\r\n" % (MAX_BODY + 1)), 413, id="CL-over-max-body"),
    pytest.param(post(b"Content-Length: 99999999999\r\n"), 413, id="CL-far-over-max-body"),
    pytest.param(post(b"Expect: 100-continue\r\nContent-Length: %d\r\n" % (MAX_BODY + 1)), 413,
                 id="CL-over-max-body-expect-100"),
]

MODES = ["whole", "bytewise", "after-keep-alive", "pipelined"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strict")
    s = start_server([], binary=CORRAL_BIN, config=CONFIG, tmp_path=tmp)
    yield s
    s.stop()


def served(srv):
    """A fresh connection gets a normal response."""
    with srv.connect() as s:
        s.sendall(GOOD)
        status, headers, body, rest = read_response(s)
        assert status == 200 and b"corral is running" in body and rest == b""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data,status", CASES)
def test_refused_and_closed(srv, data, status, mode):
    with srv.connect() as s:
        if mode == "after-keep-alive":
            s.sendall(GOOD)
            st, headers, _, rest = read_response(s)
            assert (st, rest) == (200, b"")
            assert headers.get("connection") != "close"
        t0 = time.monotonic()
        send_refusable(s, GOOD + data if mode == "pipelined" else data, mode == "bytewise")
        st, headers, _, rest = read_response(s)
        if mode == "pipelined":
            assert st == 200
            st, headers, _, rest = read_response(Prefixed(s, rest))
        # No interim 100 for a body that would be refused, and no waiting for one.
        assert st == status, f"status {st}, expected {status}"
        assert time.monotonic() - t0 < 10.0
        assert headers.get("connection") == "close"
        assert rest == b"", f"bytes after the refusal: {rest[:300]!r}"
        assert expect_closed(s) == b"", "bytes after the refusal"
    served(srv)


def test_refusals_are_logged(srv):
    """Every refusal above is logged with its reason (the log is the operator's view of them)."""
    with srv.connect() as s:
        s.sendall(get(b"GET /  HTTP/1.1"))
        assert read_response(s)[0] == 400
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=400 '
                 r'reason="two spaces in request line"')
    with srv.connect() as s:
        s.sendall(get(b"GET / HTTP/1.10"))
        assert read_response(s)[0] == 400
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=400 reason="malformed HTTP-version"')
    with srv.connect() as s:
        s.sendall(post(b"Transfer-Encoding:\r\n"))
        assert read_response(s)[0] == 400
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=400 reason="empty Transfer-Encoding"')
