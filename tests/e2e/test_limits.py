"""Limits and timeouts, with small values from the config file: sizes of the request line, head,
header count and body; header, body, keep-alive and write timeouts; max_connections; and the abuse
they exist for: slowloris (many connections trickling a head), a client that never reads (the
server must apply backpressure and give up after write_ms), a client that pipelines without reading
(the server must stop reading rather than buffer).

Timing assertions have wide upper bounds (CI has 2 cores shared with other tests): they prove a
timeout fires, not its precision. Lower bounds are tight where the client's clock starts before the
server's (after connect() or a send): a timeout must never fire early. Memory is read from
/proc/PID/status (VmRSS).
"""
import resource
import selectors
import os
import socket
import threading
import time

import pytest

from corral_test_util import exchange, expect_closed, poll, read_response, rss_kib

HOST = b"Host: localhost\r\n"
HELLO = b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"


def config(limits=None, timeouts=None):
    """A TOML config; close_ms is short so teardown never waits long on an open connection."""
    timeouts = {"close_ms": 300, **(timeouts or {})}
    text = ""
    if limits:
        text += "[limits]\n" + "".join(f"{k} = {v}\n" for k, v in limits.items())
    text += "[timeouts]\n" + "".join(f"{k} = {v}\n" for k, v in timeouts.items())
    return text


def refused(sock, status, timeout=5.0):
    st, headers, _, rest = read_response(sock, timeout=timeout)
    assert st == status
    assert headers.get("connection") == "close"
    assert rest == b""
    assert expect_closed(sock) == b""


def get_hello(srv, timeout=5.0):
    with srv.connect(timeout=timeout) as s:
        s.sendall(HELLO)
        status, _, body, _ = read_response(s, timeout=timeout)
        assert (status, body) == (200, b"hello")


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        want = n if hard == resource.RLIM_INFINITY else min(n, hard)
        if want < n:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {n}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# --- sizes ---------------------------------------------------------------------------------------

def request_line_of(length):
    """A GET request line (without CRLF) of exactly `length` bytes."""
    base = b"GET /hello?p= HTTP/1.1"
    return base.replace(b"?p=", b"?p=" + b"x" * (length - len(base)))


def test_request_line_limit(server_factory):
    srv = server_factory(config=config({"max_request_line": 64, "max_head_bytes": 1024}))
    with srv.connect() as s:  # exactly at the limit: served
        s.sendall(request_line_of(64) + b"\r\n" + HOST + b"\r\n")
        assert read_response(s)[0] == 200
    with srv.connect() as s:  # one byte over
        s.sendall(request_line_of(65) + b"\r\n" + HOST + b"\r\n")
        refused(s, 414)
    with srv.connect() as s:  # a long line is cut at the limit, before its end arrives
        s.sendall(b"GET /" + b"a" * 200)
        refused(s, 414)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=414 reason="request line too long"')
    get_hello(srv)


def head_of(length):
    """A complete request head (empty line included) of exactly `length` bytes."""
    start = b"GET /hello HTTP/1.1\r\n" + HOST + b"X-Pad: "
    pad = length - len(start) - 4
    assert pad >= 0
    return start + b"p" * pad + b"\r\n\r\n"


def test_head_size_limit(server_factory):
    srv = server_factory(config=config({"max_head_bytes": 512, "max_request_line": 256}))
    with srv.connect() as s:
        s.sendall(head_of(512))
        assert read_response(s)[0] == 200
    for over in (513, 514, 515, 516):  # whatever byte (pad, CR or LF) crosses the limit
        with srv.connect() as s:
            s.sendall(head_of(over))
            refused(s, 431)
    with srv.connect() as s:  # an endless head is cut at the limit, not buffered
        s.sendall(b"GET /hello HTTP/1.1\r\n" + HOST + b"X-Pad: " + b"p" * 2000)
        refused(s, 431)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=431 reason="request head too large"')
    get_hello(srv)


def test_header_count_limit(server_factory):
    srv = server_factory(config=config({"max_headers": 5}))
    four = b"".join(b"X-H%d: v\r\n" % i for i in range(4))
    with srv.connect() as s:  # Host + 4 = 5 fields: served
        s.sendall(b"GET /hello HTTP/1.1\r\n" + HOST + four + b"\r\n")
        assert read_response(s)[0] == 200
    with srv.connect() as s:  # 6 fields
        s.sendall(b"GET /hello HTTP/1.1\r\n" + HOST + four + b"X-H9: v\r\n\r\n")
        refused(s, 431)
    with srv.connect() as s:  # many more, without the end of the head
        s.sendall(b"GET /hello HTTP/1.1\r\n" + HOST + b"X-H: v\r\n" * 50)
        refused(s, 431)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=431 reason="too many header fields"')
    get_hello(srv)


def test_body_limit_content_length(server_factory):
    # body_ms is long: a 413 that came only after a body timeout would take 30 s.
    srv = server_factory(config=config({"max_body": 1000}, {"body_ms": 30000}))
    with srv.connect() as s:
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Content-Length: 1000\r\n\r\n" + b"b" * 1000)
        status, _, body, _ = read_response(s)
        assert (status, body) == (200, b"1000")
    with srv.connect() as s:
        # Only the head: the server refuses on the declared length, without waiting for the body.
        t0 = time.monotonic()
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Content-Length: 1001\r\n\r\n")
        refused(s, 413, timeout=5.0)
        assert time.monotonic() - t0 < 3.0
    with srv.connect() as s:  # with Expect: 100-continue, no 100 is sent before the 413
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Expect: 100-continue\r\n"
                  b"Content-Length: 5000000\r\n\r\n")
        refused(s, 413)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=413 reason="request body too large"')
    get_hello(srv)


def test_body_limit_chunked(server_factory):
    srv = server_factory(config=config({"max_body": 1000}, {"body_ms": 30000}))
    with srv.connect() as s:
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n"
                  + b"1f4\r\n" + b"a" * 500 + b"\r\n" + b"1f4\r\n" + b"b" * 500 + b"\r\n0\r\n\r\n")
        status, _, body, _ = read_response(s)
        assert (status, body) == (200, b"1000")
    with srv.connect() as s:
        # 600 + 600: the second chunk crosses the limit; the rest of the body never comes.
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n"
                  + b"258\r\n" + b"a" * 600 + b"\r\n" + b"258\r\n" + b"b" * 600 + b"\r\n")
        refused(s, 413)
    with srv.connect() as s:  # one chunk announced far beyond the limit
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n"
                  + b"100000\r\n" + b"c" * 2000)
        refused(s, 413)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=413 reason="request body too large"')
    get_hello(srv)


# --- timeouts ------------------------------------------------------------------------------------

def test_header_timeout_half_head(server_factory):
    srv = server_factory(config=config(timeouts={"header_ms": 300}))
    with srv.connect() as s:
        t0 = time.monotonic()
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: loc")
        refused(s, 408, timeout=5.0)
        elapsed = time.monotonic() - t0
    assert 0.29 <= elapsed < 3.0, elapsed  # the clock starts before the server's
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=408 reason="request head timeout"')
    get_hello(srv)


def test_header_timeout_not_extended_by_trickle(server_factory):
    """One byte every 100 ms keeps bytes coming but does not move the head deadline."""
    srv = server_factory(config=config(timeouts={"header_ms": 500}))
    head = b"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"s" * 100
    with srv.connect() as s:
        t0 = time.monotonic()
        answered = False
        for i in range(len(head)):
            s.send(head[i:i + 1])
            sel = selectors.DefaultSelector()
            sel.register(s, selectors.EVENT_READ)
            answered = bool(sel.select(timeout=0.1))
            sel.close()
            if answered:
                break
        assert answered, "no answer while trickling a head for 10 s"
        refused(s, 408)
        elapsed = time.monotonic() - t0
    assert 0.49 <= elapsed < 3.0, elapsed


def test_silent_connection_closed_without_response(server_factory):
    srv = server_factory(config=config(timeouts={"header_ms": 300}))
    with srv.connect() as s:
        t0 = time.monotonic()
        assert expect_closed(s, timeout=5.0) == b""  # no response is owed
        elapsed = time.monotonic() - t0
    assert 0.29 <= elapsed < 3.0, elapsed
    get_hello(srv)


def test_body_timeout(server_factory):
    srv = server_factory(config=config(timeouts={"body_ms": 300, "header_ms": 10000}))
    with srv.connect() as s:
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Content-Length: 10\r\n\r\n12345")
        t0 = time.monotonic()
        refused(s, 408)
        elapsed = time.monotonic() - t0
    assert 0.29 <= elapsed < 3.0, elapsed
    with srv.connect() as s:  # chunked: stalls inside a chunk
        s.sendall(b"POST /upload HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\na\r\nabc")
        refused(s, 408)
    srv.wait_log(r'request_refused remote=127\.0\.0\.1 status=408 reason="request body timeout"')
    get_hello(srv)


def test_keepalive_idle_timeout(server_factory):
    srv = server_factory(config=config(timeouts={"keepalive_ms": 300}))
    with srv.connect() as s:
        s.sendall(HELLO)
        status, headers, _, _ = read_response(s)
        assert status == 200 and headers.get("connection") != "close"
        t0 = time.monotonic()
        assert expect_closed(s, timeout=5.0) == b""  # closed silently: no 408 on an idle connection
        elapsed = time.monotonic() - t0
    assert 0.25 <= elapsed < 3.0, elapsed  # from the client's read: a little late


# --- connections ---------------------------------------------------------------------------------

def test_max_connections(server_factory):
    srv = server_factory(config=config({"max_connections": 5}, {"header_ms": 60000}))
    held = []
    try:
        # Five connections: two that have not sent anything yet (header_ms is long) and three
        # idle between requests. The server accepts in order, so the sixth comes after them.
        for i in range(5):
            s = srv.connect()
            if i >= 2:
                s.sendall(HELLO)
                assert read_response(s)[0] == 200
            held.append(s)
        with srv.connect() as extra:  # the sixth: 503 and close, without sending anything
            data = expect_closed(extra)
            assert data.startswith(b"HTTP/1.1 503 "), data
            assert b"Connection: close" in data
        srv.wait_log(r"connection_refused reason=max_connections limit=5")
        for s in held:  # the five are untouched
            s.sendall(HELLO)
            st, headers, body, _ = read_response(s)
            assert (st, body) == (200, b"hello") and headers.get("connection") != "close"
        held.pop().close()
        # The server notices the close asynchronously: retry briefly until a slot is free.
        deadline = time.monotonic() + 5
        while True:
            with srv.connect() as s:
                try:
                    s.sendall(HELLO)
                    status = read_response(s)[0]
                except (ConnectionError, OSError):
                    status = 503  # refused and closed before our request was read
                if status == 200:
                    break
                assert status == 503 and time.monotonic() < deadline, "slot never freed"
            time.sleep(0.02)
    finally:
        for s in held:
            s.close()


def test_slowloris(server_factory):
    """1,000 connections trickle one byte of a head every ~0.5 s; meanwhile 100+ normal requests on
    fresh connections are each served in under a second; at header_ms the slow ones get 408."""
    n_slow, header_ms = 1000, 4000
    raise_nofile(n_slow + 256)
    srv = server_factory(config=config(timeouts={"header_ms": header_ms}))
    head = b"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"s" * 64
    sel = selectors.DefaultSelector()
    slow = []
    results = {"latencies": [], "errors": []}
    stop = threading.Event()

    def normal_traffic():
        # Paced (about 200 per second) so that client TIME_WAIT sockets do not pile up.
        while not stop.wait(0.005):
            t = time.monotonic()
            try:
                get_hello(srv, timeout=2.0)
                results["latencies"].append(time.monotonic() - t)
            except Exception as e:  # recorded, asserted below
                results["errors"].append(repr(e))

    traffic = threading.Thread(target=normal_traffic, daemon=True)
    try:
        traffic.start()  # normal requests go on from the start of the attack
        sent = {}
        first_byte = None
        for _ in range(n_slow):
            s = socket.create_connection((srv.host, srv.port), timeout=5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.send(head[:1])  # the head deadline counts from a connection's first byte
            first_byte = first_byte or time.monotonic()
            s.setblocking(False)
            sent[s.fileno()] = 1
            slow.append(s)
            sel.register(s, selectors.EVENT_READ)
        received = {s.fileno(): b"" for s in slow}
        closed = set()
        # Trickle until shortly before the first connection's head deadline.
        trickle_until = first_byte + header_ms / 1000 - 0.8
        next_round = time.monotonic() + 0.5
        while time.monotonic() < trickle_until:
            if time.monotonic() >= next_round:
                for s in slow:
                    i = sent[s.fileno()]
                    if s.fileno() not in closed and i < len(head):
                        s.send(head[i:i + 1])
                        sent[s.fileno()] = i + 1
                next_round += 0.5
            for key, _ in sel.select(timeout=0.05):
                closed.add(key.fileobj.fileno())  # an early answer: fails below
                sel.unregister(key.fileobj)
        stop.set()
        traffic.join(timeout=10)
        assert not traffic.is_alive()
        assert not closed, f"{len(closed)} slow connections answered before header_ms"
        assert not results["errors"], results["errors"][:5]
        lat = results["latencies"]
        print(f"normal requests during the attack: {len(lat)}, slowest {max(lat, default=0):.3f}s")
        assert len(lat) >= 100, f"only {len(lat)} normal requests during the attack"
        assert max(lat) < 1.0, f"slowest normal request took {max(lat):.3f}s"
        assert min(sent.values()) >= 4, "the trickle did not run"
        # Now every slow connection must get a 408 and be closed, about header_ms after its
        # first byte.
        deadline = time.monotonic() + 10
        while len(closed) < n_slow and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                try:
                    b = s.recv(4096)
                except ConnectionResetError:
                    b = b""
                if b:
                    received[s.fileno()] += b
                else:
                    closed.add(s.fileno())
                    sel.unregister(s)
        assert len(closed) == n_slow, f"{n_slow - len(closed)} slow connections still open"
        not_408 = [r[:40] for r in received.values() if not r.startswith(b"HTTP/1.1 408 ")]
        assert not not_408, f"{len(not_408)} without a 408, e.g. {not_408[:3]}"
        poll(lambda: srv.log().count('status=408 reason="request head timeout"') >= n_slow, 5,
             f"{n_slow} request head timeouts in the log")
        get_hello(srv)
    finally:
        stop.set()
        sel.close()
        for s in slow:
            s.close()


# --- backpressure --------------------------------------------------------------------------------

def infinite_aborts(srv):
    status, _, body = exchange(srv, b"GET /infinite/aborts HTTP/1.1\r\n" + HOST + b"\r\n")
    assert status == 200
    return int(body)


def small_rcvbuf_socket(srv):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # do not let the kernel soak it up
    s.settimeout(5)
    s.connect((srv.host, srv.port))
    return s


@pytest.mark.parametrize("target,clients", [(b"/infinite", 10), (b"/big?bytes=50000000", 1)],
                         ids=["infinite", "big"])
def test_reader_that_never_reads(server_factory, target, clients):
    srv = server_factory(config=config(timeouts={"write_ms": 500}))
    get_hello(srv)
    pid = srv.proc.pid
    baseline = rss_kib(pid)
    aborts_before = infinite_aborts(srv)
    stalled = []
    try:
        for _ in range(clients):  # clients that ask and never read
            s = small_rcvbuf_socket(srv)
            s.sendall(b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
            stalled.append(s)
        # Meanwhile other requests are served promptly, and memory stays bounded.
        peak = baseline
        t0 = time.monotonic()
        while "write_timeout" not in srv.log() and time.monotonic() - t0 < 10:
            t = time.monotonic()
            get_hello(srv)
            assert time.monotonic() - t < 2.0
            peak = max(peak, rss_kib(pid))
        poll(lambda: srv.log().count("write_timeout remote=127.0.0.1") >= clients, 10,
             f"{clients} write timeouts in the log")
        peak = max(peak, rss_kib(pid))
        print(f"RSS baseline {baseline} kB, peak {peak} kB")
        if target == b"/infinite":
            # Streams wait for the socket: a few MiB at most, whatever the number of readers.
            # (ASan keeps freed buffers in its quarantine: allow it more headroom.)
            bound = 96 if os.environ.get("CORRAL_SANITIZED") else 32
            assert (peak - baseline) < bound * 1024, f"RSS grew {(peak - baseline) // 1024} MiB"
            poll(lambda: infinite_aborts(srv) >= aborts_before + clients, 5, "stream aborts")
        else:
            # A 50 MB text body is in memory while it is owed (Response::text holds it all); no
            # more than that, and it is released when the write timeout closes the connection.
            assert (peak - baseline) < 100 * 1024, f"RSS grew {(peak - baseline) // 1024} MiB"
            # Under AddressSanitizer freed memory sits in its quarantine (it is not returned to
            # the OS at once), so only an unsanitized build can show the release.
            if not os.environ.get("CORRAL_SANITIZED"):
                poll(lambda: rss_kib(pid) - baseline < 16 * 1024, 5,
                     "RSS back under baseline + 16 MiB after the write timeout")
        for s in stalled:  # the server closed each of them (a reset is fine: data was unread)
            s.settimeout(5)
            try:
                s.shutdown(socket.SHUT_WR)
                while s.recv(1 << 20):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass
        get_hello(srv)
    finally:
        for s in stalled:
            s.close()


def test_pipelining_without_reading_is_bounded(server_factory):
    """A client pipelines requests as fast as it can and never reads: the server must stop reading
    (its output queue is at the high-water mark) instead of buffering input or output without end."""
    srv = server_factory(config=config(timeouts={"write_ms": 3000}))
    get_hello(srv)
    pid = srv.proc.pid
    baseline = rss_kib(pid)
    req = b"GET /big?bytes=4096 HTTP/1.1\r\n" + HOST + b"\r\n"
    batch = req * 2000  # ~100 KB of requests, ~8 MB of responses
    s = small_rcvbuf_socket(srv)
    try:
        s.setblocking(False)
        pushed = 0
        stalled_since = None
        t0 = time.monotonic()
        budget = 300 * 1024 * 1024
        while pushed < budget and time.monotonic() - t0 < 8:
            try:
                pushed += s.send(batch)
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 1.0:
                    break  # the server has not read for a second: it stopped reading
                sel = selectors.DefaultSelector()
                sel.register(s, selectors.EVENT_WRITE)
                sel.select(timeout=0.1)
                sel.close()
        growth = rss_kib(pid) - baseline
        print(f"pushed {pushed} bytes of requests; RSS growth {growth} kB")
        assert stalled_since is not None, f"the server kept reading: {pushed >> 20} MiB accepted"
        assert pushed < 64 * 1024 * 1024, f"{pushed >> 20} MiB of requests accepted"
        assert growth < 64 * 1024, f"RSS grew {growth // 1024} MiB"
        get_hello(srv)  # others are still served
        # Reading now lets the queue drain: the first pipelined response is intact.
        s.setblocking(True)
        s.settimeout(5)
        status, _, body, _ = read_response(s)
        assert status == 200 and len(body) == 4096
    finally:
        s.close()
    get_hello(srv)
