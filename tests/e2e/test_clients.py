"""Real clients against the test site: curl, Python `requests` and `http.client`, and raw sockets
for what those clients hide (pipelining, 100-continue, HTTP/1.0, HEAD framing).

Every test reads until an event (a response, an EOF, a log line); none sleeps.
"""
import email.utils
import http.client
import json
import re
import select
import subprocess
import time

import requests

from corral_test_util import Prefixed, read_head, read_response, read_responses, read_to_eof


def curl(*args, timeout=20):
    return subprocess.run(["curl", "-sS", "--max-time", str(timeout - 5), *args],
                          capture_output=True, timeout=timeout)


# --- keep-alive -------------------------------------------------------------------------------


def test_http_client_reuses_one_connection(site):
    conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
    try:
        conn.request("GET", "/hello")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"hello"
        sock = conn.sock
        local = sock.getsockname()
        for i in range(1, 6):
            conn.request("GET", f"/users/{i}")
            r = conn.getresponse()
            assert r.status == 200
            assert json.loads(r.read()) == {"id": str(i)}
            assert not r.will_close
            # http.client opens a new socket whenever the server asked to close or closed.
            assert conn.sock is sock and conn.sock.getsockname() == local
    finally:
        conn.close()


def test_requests_session_reuses_one_connection(site):
    with requests.Session() as s:
        for i in range(6):
            r = s.get(f"{site.url}/users/{i}", timeout=5)
            assert r.status_code == 200 and r.json() == {"id": str(i)}
        pool = s.get_adapter(site.url).poolmanager.connection_from_url(site.url)
        assert pool.num_connections == 1


def test_curl_reuses_one_connection(site):
    r = curl("-w", "%{http_code}:%{num_connects}\n", "-o", "/dev/null", "-o", "/dev/null",
             "-o", "/dev/null", f"{site.url}/hello", f"{site.url}/json", f"{site.url}/users/7")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["200:1", "200:0", "200:0"]


# --- pipelining -------------------------------------------------------------------------------


def test_pipelined_requests_answered_in_order(site):
    s = site.connect()
    s.sendall(b"".join(f"GET /users/{i} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
                       for i in range(1, 17)))
    responses, left = read_responses(s, 16)
    assert [st for st, _, _ in responses] == [200] * 16
    assert [json.loads(b)["id"] for _, _, b in responses] == [str(i) for i in range(1, 17)]
    assert left == b""
    # The connection stays usable after the burst.
    s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, _, body, _ = read_response(s)
    assert (status, body) == (200, b"hello")
    s.close()


def test_pipelined_mixed_methods_and_bodies(site):
    s = site.connect()
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc"
              b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/x\r\n"
              b"Content-Length: 4\r\n\r\nping"
              b"GET /users/9 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    responses, _ = read_responses(s, 4)
    assert [(st, b) for st, _, b in responses] == [
        (200, b"3"), (200, b"hello"), (200, b"ping"), (200, b'{"id":"9"}')]
    assert responses[2][1]["content-type"] == "text/x"
    assert responses[3][1].get("connection") == "close"
    assert read_to_eof(s, reset_ok=False) == b""
    s.close()


# --- request bodies ---------------------------------------------------------------------------


def test_chunked_request_body_raw(site):
    s = site.connect()
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n"
              b"1a;ext=1\r\n" + b"z" * 26 + b"\r\n"
              b"0\r\n\r\n")
    status, _, body, _ = read_response(s)
    assert (status, body) == (200, b"31")
    s.close()


def test_chunked_request_body_requests_generator(site):
    def gen():
        for i in range(50):
            yield b"x" * 1000 + str(i).encode()

    expected = sum(1000 + len(str(i)) for i in range(50))
    r = requests.post(f"{site.url}/upload", data=gen(), timeout=5)
    assert r.status_code == 200
    assert r.text == str(expected)


def test_chunked_request_body_http_client(site):
    conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
    try:
        conn.request("POST", "/echo", body=iter([b"ab", b"cd", b"ef"]),
                     headers={"Content-Type": "text/plain"}, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"abcdef"
    finally:
        conn.close()


def test_expect_100_continue_raw(site):
    s = site.connect()
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n"
              b"Expect: 100-continue\r\n\r\n")
    status_line, headers, left = read_head(s)
    assert status_line == "HTTP/1.1 100 Continue"
    assert left == b""  # nothing but the interim response before the body is sent
    s.sendall(b"hello world")
    status, _, body, _ = read_response(s)
    assert (status, body) == (200, b"11")
    s.close()


def test_expect_100_continue_ignored_for_http10(site):
    # RFC 9110 §10.1.1: an HTTP/1.0 request's 100-continue expectation MUST be ignored. There is no
    # event for "the server chose not to answer": give it a bounded moment to (wrongly) send one.
    s = site.connect()
    s.sendall(b"POST /upload HTTP/1.0\r\nHost: localhost\r\nContent-Length: 3\r\n"
              b"Expect: 100-continue\r\n\r\n")
    ready, _, _ = select.select([s], [], [], 0.5)
    early = s.recv(65536) if ready else b""
    assert b"100 Continue" not in early, early
    s.sendall(b"abc")
    data = early + read_to_eof(s, reset_ok=False)
    assert data.startswith(b"HTTP/1.0 200 "), data[:80]
    assert data.endswith(b"\r\n\r\n3")
    s.close()


def test_expect_100_continue_refused_body_never_read(site):
    # A body over limits.max_body is refused from the head alone: 413, not 100.
    s = site.connect()
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 999999999\r\n"
              b"Expect: 100-continue\r\n\r\n")
    status, headers, _, _ = read_response(s)
    assert status == 413
    assert headers.get("connection") == "close"
    s.close()


def test_expect_100_continue_curl_large_upload(site, tmp_path):
    payload = tmp_path / "upload.bin"
    payload.write_bytes(b"u" * (3 * 1024 * 1024 + 17))
    r = curl("-v", "--expect100-timeout", "15", "-H", "Expect: 100-continue",
             "--data-binary", f"@{payload}", f"{site.url}/upload", timeout=25)
    assert r.returncode == 0, r.stderr
    assert r.stdout == str(3 * 1024 * 1024 + 17).encode()
    assert b"< HTTP/1.1 100 Continue" in r.stderr
    assert b"< HTTP/1.1 200 OK" in r.stderr


# --- HTTP/1.0 ---------------------------------------------------------------------------------


def test_http10_closes_by_default(site):
    s = site.connect()
    s.sendall(b"GET /hello HTTP/1.0\r\nHost: localhost\r\n\r\n")
    data = read_to_eof(s, reset_ok=False)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ")
    assert body == b"hello"
    assert b"connection: keep-alive" not in head.lower()
    s.close()


def test_http10_keep_alive_requested(site):
    s = site.connect()
    s.sendall(b"GET /hello HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    status_line, headers, left = read_head(s)
    assert status_line.startswith("HTTP/1.0 200")
    assert headers.get("connection", "").lower() == "keep-alive"
    assert headers["content-length"] == "5"
    # Still open: a second request on it is answered.
    s.sendall(b"GET /users/3 HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    status, _, body, _ = read_response(Prefixed(s, left[5:]))
    assert left[:5] == b"hello"
    assert (status, body) == (200, b'{"id":"3"}')
    s.close()


def test_http10_stream_is_close_delimited(site):
    s = site.connect()
    s.sendall(b"GET /stream HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    data = read_to_eof(s, reset_ok=False)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    assert b"transfer-encoding" not in head.lower()
    assert body == b"".join(f"tick {i}\n".encode() for i in range(10))
    s.close()


# --- HEAD, default headers --------------------------------------------------------------------


def test_head_from_get_route_has_length_and_no_body(site):
    s = site.connect()
    # A GET right behind the HEAD: if the HEAD response carried body bytes, they would show up
    # in front of the GET's status line.
    s.sendall(b"HEAD /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"GET /users/5 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status_line, headers, left = read_head(s)
    assert status_line == "HTTP/1.1 200 OK"
    assert headers["content-length"] == "5"
    assert headers["content-type"].startswith("text/plain")
    status, _, body, _ = read_response(Prefixed(s, left))
    assert (status, body) == (200, b'{"id":"5"}')
    s.close()


def test_head_with_requests(site):
    r = requests.head(f"{site.url}/json", timeout=5)
    g = requests.get(f"{site.url}/json", timeout=5)
    assert r.status_code == 200 and r.content == b""
    assert r.headers["Content-Length"] == str(len(g.content))


def test_date_server_and_default_headers(site):
    r = requests.get(f"{site.url}/hello", timeout=5)
    assert r.headers["Server"] == "corral"
    date = email.utils.parsedate_to_datetime(r.headers["Date"])
    assert abs(date.timestamp() - time.time()) < 60
    assert r.headers["Date"].endswith(" GMT")
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "strict-origin-when-cross-origin"
    # Error responses carry them too.
    r = requests.get(f"{site.url}/no/such/route", timeout=5)
    assert r.status_code == 404
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "Date" in r.headers and r.headers["Server"] == "corral"


def test_csp_nonce_matches_body_and_changes(site):
    nonces = []
    for _ in range(2):
        r = requests.get(f"{site.url}/html", timeout=5)
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/html")
        csp = r.headers["Content-Security-Policy"]
        m = re.search(r"script-src [^;]*'nonce-([A-Za-z0-9+/=_-]+)'", csp)
        assert m, csp
        nonce = m.group(1)
        assert len(nonce) >= 16
        assert f'<script nonce="{nonce}">' in r.text
        assert f"'nonce-{nonce}'" in csp.split("style-src", 1)[1]
        nonces.append(nonce)
    assert nonces[0] != nonces[1]


def test_no_csp_on_non_html(site):
    r = requests.get(f"{site.url}/json", timeout=5)
    assert "Content-Security-Policy" not in r.headers


# --- streams, JSON, errors --------------------------------------------------------------------


def test_stream_chunked_ten_ticks_raw(site):
    s = site.connect()
    s.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, body, _ = read_response(s)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert "content-length" not in headers
    assert body == b"".join(f"tick {i}\n".encode() for i in range(10))
    s.close()


def test_stream_arrives_incrementally_requests(site):
    arrivals = []
    with requests.get(f"{site.url}/stream", stream=True, timeout=5) as r:
        assert r.status_code == 200
        for line in r.iter_lines(chunk_size=1):
            arrivals.append((time.monotonic(), line))
    assert [line for _, line in arrivals] == [f"tick {i}".encode() for i in range(10)]
    # One line per 100 ms: the first is not held back until the last.
    assert arrivals[-1][0] - arrivals[0][0] >= 0.6


def test_stream_with_curl(site):
    r = curl(f"{site.url}/stream")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [f"tick {i}" for i in range(10)]


def test_json_parses(site):
    r = requests.get(f"{site.url}/json", timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    doc = r.json()
    assert doc["server"] == "corral"
    assert doc["remote"] == "127.0.0.1"
    assert doc["scheme"] == "http"
    r = curl(f"{site.url}/json")
    assert json.loads(r.stdout)["server"] == "corral"


def test_throw_is_generic_500_and_logged(site):
    r = requests.get(f"{site.url}/throw", timeout=5)
    assert r.status_code == 500
    assert "secret" not in r.text
    assert "internal detail" not in r.text
    assert "secret" not in "".join(f"{k}{v}" for k, v in r.headers.items())
    site.wait_log(r'route_error pattern="GET /throw" .*secret internal detail')
    # The server keeps serving.
    assert requests.get(f"{site.url}/hello", timeout=5).text == "hello"


def test_access_log_line(site):
    requests.get(f"{site.url}/users/77?x=1", timeout=5)
    site.wait_log(r"info access remote=127\.0\.0\.1 method=GET target=/users/77\?x=1 status=200 "
                  r"bytes=11 ms=\d+")
