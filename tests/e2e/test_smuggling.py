"""Request-smuggling attempts: in each, a second request to /canary hides behind an ambiguity in the
first one's framing (CL.TE, TE.CL, obfuscated Transfer-Encoding, odd Content-Length spellings,
chunk-size tricks, bare LF, obs-fold) or follows a request after which the server must not parse
anything more (a refusal, `Connection: close`).

A server that reads the ambiguity differently from a front proxy would run the hidden request: the
test site's /canary counts its runs, so GET /canary/count on a fresh connection must stay 0, and the
connection must carry exactly the expected responses and then be closed by the server (nothing
after the error response). Each attempt is sent whole and byte by byte (one send per byte, so the
body parser sees every split point).
"""

import pytest

from corral_test_util import Prefixed, exchange, expect_closed, read_response, send_refusable

HOST = b"Host: localhost\r\n"
CANARY = b"GET /canary HTTP/1.1\r\nHost: localhost\r\n\r\n"
CONFIG = "[timeouts]\nclose_ms = 300\n"


def post(headers, body=b"", target=b"/upload"):
    return b"POST " + target + b" HTTP/1.1\r\n" + HOST + headers + b"\r\n" + body


def chunked(headers, body):
    return post(b"Transfer-Encoding: chunked\r\n" + headers, body)


# (bytes, expected statuses on the connection in order; the last one closes the connection)
ATTEMPTS = [
    # CL.TE: a front end honouring Content-Length forwards the canary inside the body; a back end
    # honouring chunked would end the body at "0\r\n\r\n" and then run the canary.
    pytest.param(post(b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % (5 + len(CANARY)),
                      b"0\r\n\r\n" + CANARY), [400], id="CL.TE"),
    # TE.CL: the chunk carries the canary; a back end honouring Content-Length: 4 would run it.
    pytest.param(post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                      b"%x\r\n" % len(CANARY) + CANARY + b"\r\n0\r\n\r\n"), [400], id="TE.CL"),
    # TE.TE: one side does not recognise an obfuscated Transfer-Encoding.
    pytest.param(post(b"Content-Length: 5\r\nTransfer-Encoding: xchunked\r\n", b"0\r\n\r\n" + CANARY),
                 [400], id="TE.TE-xchunked-with-CL"),
    pytest.param(post(b"Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n" + CANARY), [501],
                 id="TE.TE-xchunked"),
    pytest.param(post(b"Content-Length: 5\r\nTransfer-Encoding : chunked\r\n", b"0\r\n\r\n" + CANARY),
                 [400], id="TE.TE-space-before-colon"),
    pytest.param(chunked(b"Transfer-Encoding: identity\r\n", b"0\r\n\r\n" + CANARY), [400],
                 id="TE.TE-chunked-then-identity"),  # chunked not final: 400 (RFC 9112 §6.3)
    pytest.param(post(b"Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
                      b"0\r\n\r\n" + CANARY), [501], id="TE.TE-identity-then-chunked"),
    pytest.param(post(b'Transfer-Encoding: "chunked"\r\n', b"0\r\n\r\n" + CANARY), [501],
                 id="TE.TE-quoted"),
    pytest.param(post(b"Transfer-Encoding: \x0bchunked\r\n", b"0\r\n\r\n" + CANARY), [400],
                 id="TE.TE-vertical-tab"),
    pytest.param(post(b"Transfer-Encoding\x00: chunked\r\n", b"0\r\n\r\n" + CANARY), [400],
                 id="TE.TE-nul-in-name"),
    pytest.param(post(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + CANARY,
                      target=b"/upload").replace(b"HTTP/1.1", b"HTTP/1.0", 1), [400],
                 id="TE-in-HTTP/1.0"),
    # Content-Length spellings that parsers read differently.
    pytest.param(post(b"Content-Length: +0\r\n", CANARY), [400], id="CL-leading-plus"),
    pytest.param(post(b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(CANARY), CANARY), [400],
                 id="CL-double"),
    pytest.param(post(b"Content-Length: %d\r\nContent-Length: 0\r\n" % len(CANARY), CANARY), [400],
                 id="CL-double-reversed"),
    pytest.param(post(b"Content-Length: 0, %d\r\n" % len(CANARY), CANARY), [400], id="CL-list"),
    pytest.param(post(b"Content-Length: 0x%x\r\n" % len(CANARY), CANARY), [400], id="CL-hex"),
    # Chunk-size and chunk-extension tricks: each hides a complete chunked body ending before the
    # canary, so a lenient parser would run it as the next request.
    pytest.param(chunked(b"", b"2;ext\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-ext-bare-LF"),
    pytest.param(chunked(b"", b'2;a="x\r\nxx\r\n0\r\n\r\n' + CANARY), [400],
                 id="chunk-ext-unterminated-quote"),
    pytest.param(chunked(b"", b"2;\r\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-ext-empty"),
    pytest.param(chunked(b"", b"2;a=\x01\r\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-ext-control"),
    pytest.param(chunked(b"", b"0x2\r\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-size-0x"),
    pytest.param(chunked(b"", b"-2\r\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-size-negative"),
    pytest.param(chunked(b"", b" 2\r\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-size-leading-space"),
    pytest.param(chunked(b"", b"2\nxx\r\n0\r\n\r\n" + CANARY), [400], id="chunk-size-bare-LF"),
    pytest.param(chunked(b"", b"ffffffffffffffffff\r\nx\r\n0\r\n\r\n" + CANARY), [400],
                 id="chunk-size-overflow"),
    # 2^64 + 1: wrapping arithmetic would read a 1-byte chunk.
    pytest.param(chunked(b"", b"10000000000000001\r\nx\r\n0\r\n\r\n" + CANARY), [400],
                 id="chunk-size-wraps-to-1"),
    # The last chunk without its empty line: the canary would be read as a trailer section.
    pytest.param(chunked(b"", b"0\r\n" + CANARY), [400], id="last-chunk-then-request"),
    pytest.param(chunked(b"", b"2\r\nxxYY0\r\n\r\n" + CANARY), [400], id="chunk-data-overrun"),
    # Bare LF: a valid request, then one whose lines end in LF only.
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"\r\n" + CANARY.replace(b"\r\n", b"\n"),
                 [200, 400], id="bare-LF-second-request"),
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"X: a\nGET /canary HTTP/1.1\r\n\r\n", [400],
                 id="bare-LF-inside-head"),
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"X: a\rGET /canary HTTP/1.1\r\n\r\n", [400],
                 id="bare-CR-inside-head"),
    # obs-fold hiding a header from a parser that unfolds (or one that does not).
    pytest.param(post(b"Content-Length: 5\r\nX: a\r\n\tTransfer-Encoding: chunked\r\n",
                      b"0\r\n\r\n" + CANARY), [400], id="obs-fold-hidden-TE"),
    pytest.param(post(b"Content-Length: 0\r\n %d\r\n" % len(CANARY), CANARY), [400],
                 id="obs-fold-continued-CL"),
    # Nothing after a refusal is ever parsed, whether the refusal comes from the parser or from
    # admission, and a refused request to /canary itself never runs.
    pytest.param(b"GET /%zz HTTP/1.1\r\n" + HOST + b"\r\n" + CANARY, [400], id="pipelined-after-400"),
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"Bad Header: x\r\n\r\n" + CANARY, [400],
                 id="pipelined-after-parse-400"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: evil.example\r\n\r\n" + CANARY, [403],
                 id="pipelined-after-403"),
    pytest.param(b"POST /canary HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 0\r\n\r\n", [403],
                 id="canary-foreign-host"),
    pytest.param(chunked(b"", b"zz\r\n").replace(b"/upload", b"/canary"), [400],
                 id="canary-bad-chunked-body"),
    pytest.param(post(b"Content-Length: 99999999999\r\n", CANARY), [413], id="pipelined-after-413"),
    # `Connection: close` (and HTTP/1.0 without keep-alive): no further request is processed
    # (RFC 9112 §9.6).
    pytest.param(b"GET /hello HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n" + CANARY, [200],
                 id="after-connection-close"),
    pytest.param(b"GET /hello HTTP/1.0\r\n" + HOST + b"\r\n" + CANARY, [200], id="after-http10"),
]


def read_responses(sock, count):
    """Reads `count` responses; returns their statuses, the last one's headers and what follows."""
    reader = Prefixed(sock)
    statuses, headers = [], {}
    for _ in range(count):
        try:
            status, headers, _, rest = read_response(reader)
        except ConnectionError:
            break
        statuses.append(status)
        reader.prefix = rest + reader.prefix
    return statuses, headers, reader.prefix


def canary_count(srv):
    status, _, body = exchange(srv, b"GET /canary/count HTTP/1.1\r\n" + HOST + b"\r\n")
    assert status == 200
    return int(body)


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("data,statuses", ATTEMPTS)
def test_smuggling(server_factory, data, statuses, bytewise):
    srv = server_factory(config=CONFIG)
    with srv.connect() as s:
        send_refusable(s, data, bytewise)
        got, headers, rest = read_responses(s, len(statuses))
        assert got == statuses, f"responses {got}, expected {statuses}"
        assert headers.get("connection") == "close"
        assert rest == b"", f"a response after the last expected one: {rest[:300]!r}"
        assert expect_closed(s) == b"", "a response after the last expected one"
    assert canary_count(srv) == 0


def test_get_with_body_hides_nothing(server_factory):
    """A GET with a Content-Length body: the body (which looks like a request to /canary) is read
    and dropped, the connection stays usable, and the next real request is parsed after it."""
    srv = server_factory(config=CONFIG)
    with srv.connect() as s:
        s.sendall(b"GET /hello HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n" % len(CANARY)
                  + CANARY)
        status, headers, body, rest = read_response(s)
        assert (status, body, rest) == (200, b"hello", b"")
        assert headers.get("connection") != "close"
        s.sendall(b"GET /canary/count HTTP/1.1\r\n" + HOST + b"\r\n")
        status, _, body, rest = read_response(s)
        assert (status, body, rest) == (200, b"0", b"")
    assert canary_count(srv) == 0


@pytest.mark.parametrize("ext", [b";name", b";name=value", b';q="quoted"', b';q="a;b";name',
                                 b";a=b;c=d"])
def test_valid_chunk_extension_is_data_not_a_request(server_factory, ext):
    """The control: valid chunk extensions (RFC 9112 §7.1.1: any number of them) are ignored, and the bytes of the chunk (a request to /canary) are data, not a request."""
    srv = server_factory(config=CONFIG)
    body = b"%x" % len(CANARY) + ext + b"\r\n" + CANARY + b"\r\n0\r\n\r\n"
    with srv.connect() as s:
        s.sendall(chunked(b"", body))
        status, _, got, rest = read_response(s)
        assert (status, got, rest) == (200, str(len(CANARY)).encode(), b"")
    assert canary_count(srv) == 0
