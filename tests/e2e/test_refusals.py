"""Every refusal of the strict parser and of the admission baseline, over raw sockets.

Each malformed request is sent three ways: whole (one send), byte by byte (one send per byte with
TCP_NODELAY, so the server sees every split point), and after a valid keep-alive request on the same
connection (the first answer is a 200 that keeps the connection open, then the refusal). The server
must answer the exact status with `Connection: close`, close the connection without a second
response, log `request_refused ... status=N reason="..."` plus an access line, and go on serving
fresh connections.

Statuses follow RFC 9112/9110: framing errors are 400 (§6.3: conflicting or invalid Content-Length,
Content-Length with Transfer-Encoding, chunked not final), a transfer coding we do not implement is
501 (§6.1), an unsupported version 505, a method we refuse 501; admission (src/http/admission.h)
answers 400 for a malformed target or Host and 403 for a foreign Host, a forwarding header from a
non-relay and an absolute-form target.
"""
import re
import select
import socket
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import expect_closed, read_response

HOST = b"Host: localhost\r\n"
KEEPALIVE_REQUEST = b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
# A short close timeout keeps teardown fast if a test fails with a connection still open.
CONFIG = "[timeouts]\nclose_ms = 300\n"


def get(target=b"/hello", headers=HOST, version=b"HTTP/1.1", method=b"GET"):
    return method + b" " + target + b" " + version + b"\r\n" + headers + b"\r\n"


def post(headers, body=b""):
    return b"POST /upload HTTP/1.1\r\n" + HOST + headers + b"\r\n" + body


CL = "content-length"
CASES = [
    # --- message framing (RFC 9112 §6) ---
    pytest.param(post(b"Content-Length: 1\r\nContent-Length: 2\r\n", b"ab"), 400, CL,
                 id="cl-conflicting"),
    pytest.param(post(b"Content-Length: 1\r\nContent-Length: 1\r\n", b"a"), 400, CL, id="cl-duplicate"),
    pytest.param(post(b"Content-Length: 1x\r\n", b"a"), 400, CL, id="cl-trailing-garbage"),
    pytest.param(post(b"Content-Length: -1\r\n", b"a"), 400, CL, id="cl-negative"),
    pytest.param(post(b"Content-Length: 1, 1\r\n", b"a"), 400, CL, id="cl-list"),
    pytest.param(post(b"Content-Length: +1\r\n", b"a"), 400, CL, id="cl-plus"),
    pytest.param(post(b"Content-Length: \r\n"), 400, CL, id="cl-empty"),
    pytest.param(post(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"), 400,
                 "content-length.*transfer-encoding", id="cl-with-te"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n"), 400,
                 "content-length.*transfer-encoding", id="te-with-cl"),
    pytest.param(post(b"Transfer-Encoding: gzip\r\n", b"x"), 501, "unsupported transfer coding",
                 id="te-gzip"),
    # gzip is a coding we do not implement (501, §6.1) even though chunked is final.
    pytest.param(post(b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"), 501,
                 "unsupported transfer coding", id="te-gzip-chunked"),
    # chunked not final: the length cannot be determined (400, §6.3 rule 4).
    pytest.param(post(b"Transfer-Encoding: chunked, gzip\r\n", b"0\r\n\r\n"), 400, "transfer-encoding",
                 id="te-chunked-not-final"),
    pytest.param(post(b"Transfer-Encoding: chunked, chunked\r\n", b"0\r\n\r\n"), 400,
                 "transfer-encoding", id="te-chunked-twice"),
    pytest.param(b"POST /upload HTTP/1.0\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 400, "transfer-encoding in an http/1.0 request", id="te-in-http10"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"zz\r\nab\r\n0\r\n\r\n"), 400, "chunk size",
                 id="chunk-size-not-hex"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"3\r\nabcX0\r\n\r\n"), 400, "chunk|lf|cr",
                 id="chunk-data-without-crlf"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"2\r\nxxYY0\r\n\r\n"), 400, "chunk|lf|cr",
                 id="chunk-data-overrun"),
    pytest.param(post(b"Transfer-Encoding: chunked\r\n", b"ffffffffffffffffff\r\n"), 400, "overflow",
                 id="chunk-size-overflow"),
    pytest.param(get(headers=HOST + b"Expect: something-else\r\n"), 417, "unsupported expectation",
                 id="expect-unknown"),
    # --- the head's syntax (RFC 9112 §2, §5) ---
    pytest.param(get(headers=HOST + b"X-A: 1\r\n folded\r\n"), 400, "obs-fold", id="obs-fold-space"),
    pytest.param(get(headers=HOST + b"X-A: 1\r\n\tfolded\r\n"), 400, "obs-fold", id="obs-fold-tab"),
    pytest.param(b"GET /hello HTTP/1.1\r\n Host: localhost\r\n\r\n", 400, "obs-fold",
                 id="first-header-indented"),
    pytest.param(get(headers=HOST + b"X-A : 1\r\n"), 400,
                 "whitespace before colon|invalid character in header name", id="space-before-colon"),
    pytest.param(get(headers=HOST + b"X-A\t: 1\r\n"), 400,
                 "whitespace before colon|invalid character in header name", id="tab-before-colon"),
    pytest.param(get(headers=HOST + b"X-A\r\n"), 400, "without a colon", id="header-without-colon"),
    pytest.param(get(headers=HOST + b": x\r\n"), 400, "empty header name", id="empty-header-name"),
    pytest.param(get(headers=HOST + b"X-A: 1\r2\r\n"), 400, "bare CR", id="bare-cr-in-value"),
    pytest.param(b"GET /hello HTTP/1.1\r\r\n" + HOST + b"\r\n", 400, "bare CR", id="bare-cr-request-line"),
    pytest.param(b"GET /hello HTTP/1.1\n" + HOST + b"\r\n", 400, "bare LF", id="bare-lf-request-line"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: localhost\nX-A: 1\r\n\r\n", 400, "bare LF",
                 id="bare-lf-header"),
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"\n", 400, "bare LF", id="bare-lf-end-of-head"),
    pytest.param(get(headers=HOST + b"X-A: a\x01b\r\n"), 400, "control character", id="ctl-0x01-value"),
    pytest.param(get(headers=HOST + b"X-A: a\x00b\r\n"), 400, "control character", id="ctl-nul-value"),
    pytest.param(get(headers=HOST + b"X-A: a\x7fb\r\n"), 400, "control character", id="ctl-del-value"),
    pytest.param(get(target=b"/hel\x01lo"), 400, "control character", id="ctl-in-target"),
    pytest.param(b"GET\t/hello HTTP/1.1\r\n" + HOST + b"\r\n", 400, "tab in request line",
                 id="tab-in-request-line"),
    pytest.param(get(version=b"HTTP/2.0"), 505, "HTTP version", id="version-2.0"),
    pytest.param(get(version=b"HTTP/1.2"), 505, "HTTP version", id="version-1.2"),
    pytest.param(get(version=b"HTTP/3.0"), 505, "HTTP version", id="version-3.0"),
    pytest.param(get(version=b"HTTP/0.9"), 505, "HTTP version", id="version-0.9"),
    # --- admission: Host (RFC 9112 §3.2) and DNS-rebinding protection ---
    pytest.param(get(headers=b""), 400, "missing Host header", id="host-missing"),
    pytest.param(get(headers=HOST + HOST), 400, "more than one Host header", id="host-duplicate"),
    pytest.param(get(headers=b"Host: local host\r\n"), 400, "invalid Host header", id="host-space"),
    pytest.param(get(headers=b"Host: user@localhost\r\n"), 400, "invalid Host header",
                 id="host-userinfo"),
    pytest.param(get(headers=b"Host: localhost:\r\n"), 400, "invalid Host header", id="host-empty-port"),
    pytest.param(get(headers=b"Host: localhost:99999\r\n"), 400, "invalid Host header",
                 id="host-port-range"),
    pytest.param(get(headers=b"Host: evil.example\r\n"), 403, "host not allowed", id="host-foreign"),
    pytest.param(get(headers=b"Host: evil.example:80\r\n"), 403, "host not allowed",
                 id="host-foreign-port"),
    # --- admission: forwarding headers from a peer that is not a relay ---
    pytest.param(get(headers=HOST + b"Forwarded: for=192.0.2.1\r\n"), 403, "non-relay", id="forwarded"),
    pytest.param(get(headers=HOST + b"X-Forwarded-For: 192.0.2.1\r\n"), 403, "non-relay",
                 id="x-forwarded-for"),
    pytest.param(get(headers=HOST + b"X-Forwarded-Proto: https\r\n"), 403, "non-relay",
                 id="x-forwarded-proto"),
    pytest.param(get(headers=HOST + b"x-forwarded-host: evil.example\r\n"), 403, "non-relay",
                 id="x-forwarded-host-lowercase"),
    # --- admission: the target ---
    pytest.param(get(target=b"http://localhost/hello"), 403, "absolute-form", id="target-absolute"),
    pytest.param(get(target=b"*"), 400, "asterisk-form", id="target-asterisk-get"),
    pytest.param(get(target=b"/%zz"), 400, "percent-escape", id="target-bad-escape"),
    pytest.param(get(target=b"/hello?a=%4"), 400, "percent-escape", id="target-bad-escape-query"),
    pytest.param(get(target=b"/a/../hello"), 400, "dot-segment", id="target-dotdot"),
    pytest.param(get(target=b"/./hello"), 400, "dot-segment", id="target-dot"),
    pytest.param(get(target=b"/a/%2e%2E/hello"), 400, "dot-segment", id="target-escaped-dotdot"),
    pytest.param(get(target=b"/a/.."), 400, "dot-segment", id="target-trailing-dotdot"),
    pytest.param(get(target=b"/hello#frag"), 400, "fragment", id="target-fragment"),
    pytest.param(get(target=b"hello"), 400, "url|target", id="target-relative"),
    # --- admission: methods ---
    pytest.param(get(target=b"/", method=b"TRACE"), 501, "method not implemented", id="TRACE"),
    pytest.param(get(target=b"/", method=b"TRACK"), 501, "method not implemented", id="TRACK"),
    pytest.param(get(target=b"localhost:80", method=b"CONNECT"), 501, "method not implemented",
                 id="CONNECT"),
    pytest.param(get(target=b"/", method=b"FOO"), 501, "method not implemented", id="FOO"),
]

MODES = ["whole", "bytewise", "after-keepalive"]


def send_bytewise(sock, data):
    """One send per byte; stops early once the server has answered (it may refuse mid-head)."""
    for i in range(len(data)):
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            return
        try:
            sock.send(data[i:i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return


def peek_version(sock):
    sock.settimeout(5.0)
    head = b""
    while len(head) < 9:
        head = sock.recv(9, socket.MSG_PEEK)
        if not head:
            raise ConnectionError("closed without a response")
    return head[:8]


def get_hello(srv):
    with srv.connect() as s:
        s.sendall(KEEPALIVE_REQUEST)
        status, _, body, _ = read_response(s)
        assert (status, body) == (200, b"hello")


def refuse_once(srv, data, status, mode):
    with srv.connect() as s:
        if mode == "after-keepalive":
            s.sendall(KEEPALIVE_REQUEST)
            st, headers, body, rest = read_response(s)
            assert (st, body, rest) == (200, b"hello", b"")
            assert headers.get("connection") != "close"
        if mode == "bytewise":
            send_bytewise(s, data)
        else:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the refusal may come before the last bytes; it is read below
        # The server answers as a server conformant to HTTP/1.1 (RFC 9110 §2.5): never with the
        # minor version of some other major version (an HTTP/1.0 request may get HTTP/1.0).
        version = peek_version(s)
        http10 = data.split(b"\r\n", 1)[0].endswith(b" HTTP/1.0")
        assert version == b"HTTP/1.1" or (http10 and version == b"HTTP/1.0"), version
        st, headers, body, rest = read_response(s)
        assert st == status, f"expected {status}, got {st} {headers} {body!r}"
        assert headers.get("connection") == "close"
        assert rest == b"", f"bytes after the refusal: {rest[:300]!r}"
        assert expect_closed(s) == b"", "bytes after the refusal"
    get_hello(srv)  # the refusal did not hurt the server


@pytest.mark.parametrize("data,status,reason", CASES)
def test_refusal(server_factory, data, status, reason):
    """The three ways of sending run on one server (each on its own connection), so one log flush
    (every 100 ms) is awaited per case rather than per way."""
    srv = server_factory(config=CONFIG)
    for mode in MODES:
        try:
            refuse_once(srv, data, status, mode)
        except (AssertionError, OSError) as e:
            raise AssertionError(f"[sent {mode}] {e}") from e
    # The refusal line and the access line (written through a buffer) both appear, once per way.
    lines = [rf'request_refused remote=127\.0\.0\.1 status={status} reason="(?i:[^"]*(?:{reason}))[^"]*"',
             rf"access remote=127\.0\.0\.1 method=\S+ target=\S+ status={status} "]
    deadline = time.monotonic() + 5
    while any(len(re.findall(line, srv.log())) < len(MODES) for line in lines):
        assert time.monotonic() < deadline, f"want {len(MODES)} lines like {lines}:\n{srv.log()}"
        time.sleep(0.02)
    assert all(len(re.findall(line, srv.log())) == len(MODES) for line in lines), srv.log()


@pytest.mark.parametrize("header,setting", [
    (b"Host: evil.example\r\n", r"allowed_hosts \(or --allowed-host HOST\)"),
    (HOST + b"X-Forwarded-For: 192.0.2.1\r\n", r"relays \(or --relay ADDRESS/CIDR\)"),
], ids=["foreign-host", "x-forwarded-for"])
def test_admission_refusal_names_the_setting_in_the_log_only(server_factory, header, setting):
    """The 403's log line names the setting and the flag an operator is looking for; the client
    still gets a bare Forbidden."""
    srv = server_factory(config=CONFIG)
    with srv.connect() as s:
        s.sendall(get(headers=header))
        status, _, body, _ = read_response(s)
    assert status == 403
    assert b"allowed_hosts" not in body and b"relay" not in body, body
    srv.wait_log(rf'request_refused remote=127\.0\.0\.1 status=403 reason="[^"]*{setting}"')


def test_allowed_host_flag_admits_the_host(server_factory):
    srv = server_factory("--allowed-host", "evil.example", binary=CORRAL_BIN, config=CONFIG)
    with srv.connect() as s:
        s.sendall(get(headers=b"Host: evil.example\r\n"))
        status, _, body, _ = read_response(s)
    assert (status, body) == (200, b"hello")
