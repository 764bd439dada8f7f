"""A flood of hostile input while a second client is served throughout (issue 11, acceptance):

  * 10,000 requests whose route parameter is random bytes, percent-encoded (each byte at random
    escaped or, where a path allows it, raw), over keep-alive connections, to the counter worker
    route of a real `corral serve`: nine in ten go to a pool of addresses made of random bytes
    (invalid UTF-8, controls, '%', long keys among them; few enough that any bound on workers is
    far), the tenth carries a %00 or %2F that the router must refuse without starting anything;
  * a WebSocket client sending random frames (random opcodes, lengths, masks, garbage bytes) to the
    C++ worker's /echo through the relay, reconnecting whenever it is closed;
  * meanwhile a second client asks /counter/steady/ over and over on one keep-alive connection.

No process dies (the supervisor and the server process keep their pids, as `corral ctl processes`
shows them), every request of the second client succeeds, every pool request is answered by its
own worker with its own address (echoed byte-exact in its wire form), and the refused ones are
4xx.
"""
import http.client
import json
import os
import random
import socket
import threading

from test_addresses import pct, start_counter, wire_encode

REQUESTS = 10_000
POOL = 40
THREADS = 4
PCHAR = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@")


def random_key(rng):
    kind = rng.random()
    if kind < 0.1:
        n = rng.randint(200, 320)  # long keys: bounded file names
    else:
        n = rng.randint(1, 24)
    b = bytes(rng.randint(1, 255) for _ in range(n))
    return b.replace(b"/", b"_")  # '/' cannot be in a key (%2F is refused)


def encode_randomly(rng, b):
    """A path segment for `b`: each byte escaped, or raw where a path allows it."""
    return "".join(chr(x) if x in PCHAR and rng.random() < 0.5 else f"%{x:02X}" for x in b)


def ws_frames(rng):
    """A burst of random frames: random FIN/RSV/opcode, lengths (also the 16- and 64-bit forms,
    lying about what follows), masked or not, random payload; sometimes plain garbage."""
    out = bytearray()
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.15:
            out += os.urandom(rng.randint(1, 64))
            continue
        first = rng.randint(0, 255)
        masked = rng.random() < 0.8
        n = rng.choice([rng.randint(0, 125), rng.randint(0, 300), 126, 127])
        payload = os.urandom(min(n, 300) if n < 126 else rng.randint(0, 300))
        if n < 126:
            out += bytes([first, (0x80 if masked else 0) | n])
        elif n == 126:
            out += bytes([first, (0x80 if masked else 0) | 126]) + len(payload).to_bytes(2, "big")
        else:
            out += bytes([first, (0x80 if masked else 0) | 127]) + rng.randint(
                0, 2**64 - 1).to_bytes(8, "big")
        if masked:
            key = os.urandom(4)
            out += key + bytes(x ^ key[i % 4] for i, x in enumerate(payload))
        else:
            out += payload
    return bytes(out)


def ws_fuzz(host, port, stop, rng, stats):
    while not stop.is_set():
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError:
            stats["connect_errors"] += 1
            continue
        try:
            s.sendall(b"GET /counter/wsfuzz/echo HTTP/1.1\r\nHost: localhost\r\n"
                      b"Origin: http://localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Version: 13\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
            if not head.startswith(b"HTTP/1.1 101"):
                stats["refused"] += 1
                continue
            stats["upgrades"] += 1
            s.settimeout(0.2)
            for _ in range(rng.randint(1, 20)):
                s.sendall(ws_frames(rng))
                stats["bursts"] += 1
                try:
                    if not s.recv(65536):
                        break  # closed by the worker (a protocol error): reconnect
                except socket.timeout:
                    pass
        except OSError:
            pass  # reset by the peer after garbage: expected
        finally:
            s.close()


def test_random_addresses_and_ws_frames_while_a_client_is_served(server_factory, tmp_path):
    c = start_counter(server_factory, tmp_path, 'idle = "60s"\n')
    rng = random.Random(0xC0FFEE)
    pool = []
    while len(pool) < POOL:
        k = random_key(rng)
        if k not in pool:
            pool.append(k)

    # Start every pool worker first (a few at a time), so the flood measures serving, not forks.
    for k in pool:
        status, body = c.get("/counter/" + pct(k) + "/start", timeout=60)
        assert status == 200, (k, status, body[:300], c.srv.log()[-3000:])

    stop = threading.Event()
    steady = {"ok": 0, "failed": []}

    def steady_client():
        conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=30)
        try:
            while not stop.is_set():
                try:
                    conn.request("GET", "/counter/steady/")
                    r = conn.getresponse()
                    body = r.read()
                    if r.status == 200:
                        steady["ok"] += 1
                    else:
                        steady["failed"].append((r.status, body[:200]))
                except (OSError, http.client.HTTPException) as e:
                    steady["failed"].append(repr(e))
                    conn.close()
                    conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=30)
        finally:
            conn.close()

    ws_stats = {"upgrades": 0, "bursts": 0, "refused": 0, "connect_errors": 0}
    assert c.get("/counter/steady/")[0] == 200
    assert c.get("/counter/wsfuzz/")[0] == 200
    threads = [threading.Thread(target=steady_client),
               threading.Thread(target=ws_fuzz,
                                args=(c.srv.host, c.srv.port, stop, random.Random(7), ws_stats))]
    for t in threads:
        t.start()

    problems = []
    counts = {"pool": 0, "refused": 0}
    lock = threading.Lock()

    def flood(seed, n):
        r = random.Random(seed)
        conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=60)
        try:
            for _ in range(n):
                if r.random() < 0.9:
                    k = r.choice(pool)
                    path = "/counter/" + encode_randomly(r, k) + "/start"
                    expect = wire_encode(b"counter:" + k)
                else:
                    junk = random_key(r)
                    cut = r.randint(0, len(junk))
                    path = ("/counter/" + encode_randomly(r, junk[:cut]) + r.choice(["%00", "%2F"])
                            + encode_randomly(r, junk[cut:]) + "/start")
                    expect = None
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    body = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        problems.append((path, repr(e)))
                    conn.close()
                    conn = http.client.HTTPConnection(c.srv.host, c.srv.port, timeout=60)
                    continue
                with lock:
                    if expect is None:
                        counts["refused"] += 1
                        if not 400 <= resp.status < 500:
                            problems.append((path, resp.status, body[:200]))
                    else:
                        counts["pool"] += 1
                        if resp.status != 200 or json.loads(body).get("address") != expect:
                            problems.append((path, resp.status, body[:200]))
        finally:
            conn.close()

    workers = [threading.Thread(target=flood, args=(i, REQUESTS // THREADS))
               for i in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=240)
    stop.set()
    for t in threads:
        t.join(timeout=30)

    assert counts["pool"] + counts["refused"] + len(problems) >= REQUESTS - len(problems)
    assert not problems, problems[:10]
    assert counts["pool"] + counts["refused"] == REQUESTS, counts
    assert steady["ok"] > 0 and not steady["failed"], steady["failed"][:10]
    assert ws_stats["upgrades"] > 0 and ws_stats["bursts"] > 0, ws_stats
    c.assert_nothing_died()
    listed = c.workers()
    for k in pool:
        assert listed.get(wire_encode(b"counter:" + k), {}).get("status") == "running", k
    assert "worker_failed" not in c.srv.log(), c.srv.log()[-3000:]
