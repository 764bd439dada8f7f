"""HTTP/3 against an attacker (issue 11, defects 13-15): hand-built QUIC datagrams from UDP sockets
that never answer, against tests/quic/h3_testsite.

- Amplification: 0-RTT and Initial datagrams below 1200 bytes, draft-29 and v2-draft ones, with
  Retry on, off and auto: what comes back is counted, never more than 3x what was sent (RFC 9000
  §8.1); small datagrams get nothing, big non-v1 ones get Version Negotiation listing v1 only.
- Rate limits: Retries (and Version Negotiation) come from a token bucket per process.
- A spoofed-Initial flood: one real client Initial (captured from gtlsclient) replayed from many
  source addresses (all of 127/8 is local; IP_PKTINFO picks the source per datagram) while a
  normal gtlsclient keeps fetching; the server's RSS stays bounded and every fetch succeeds.
- A request stream closed before any HEADERS: a stream error (H3_REQUEST_INCOMPLETE), the
  connection lives on (tests/quic/h3_rawclient).
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import test_h3
from test_h3 import CLIENT, fetch, read, stats

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))  # corral_test_util: the shared helpers
from corral_test_util import rss_kib  # noqa: E402 (after the path it is found on)

certs, start_site = test_h3.certs, test_h3.start_site  # the fixtures, shared with test_h3.py
RAWCLIENT = os.environ.get("CORRAL_H3_RAWCLIENT") or os.path.join(
    HERE, "..", "..", "build", "debug", "h3_rawclient")

V1 = 0x00000001
DRAFT29 = 0xFF00001D
V2_DRAFT = 0x709A50C4
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)


def long_header(first, version, dcid, scid, rest):
    return bytes([first]) + struct.pack("!I", version) + bytes([len(dcid)]) + dcid + \
        bytes([len(scid)]) + scid + rest


def varint2(n):
    return struct.pack("!H", 0x4000 | n)


def initial(version, size, dcid=None, scid=None):
    """A long-header Initial (v1 numbering: type 0) of `size` bytes: token length 0, a Length
    field, and random bytes (it does not decrypt; the size and the header are what matter)."""
    dcid = dcid or os.urandom(8)
    scid = scid or os.urandom(8)
    head = long_header(0xC0, version, dcid, scid, b"\x00")
    n = max(size - len(head) - 2, 1)
    return head + varint2(min(n, 0x3FFF)) + os.urandom(n)


def zero_rtt(size, dcid=None):
    """A v1 0-RTT packet (type 1) with an 8-byte DCID, as small as 17 bytes."""
    dcid = dcid or os.urandom(8)
    head = long_header(0xD0, V1, dcid, b"", b"")
    n = max(size - len(head) - 2, 0)
    return head + varint2(n) + os.urandom(n)


def drain(sock, quiet=0.5, limit=10.0):
    """Everything that arrives on `sock` until it is quiet for `quiet` s (at most `limit` s)."""
    got = []
    sock.settimeout(quiet)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            data, _ = sock.recvfrom(65536)
        except socket.timeout:
            break
        got.append(data)
    return got


@pytest.mark.parametrize("retry", ["auto", "on", "off"])
def test_small_datagrams_are_not_amplified(start_site, tmp_path, retry):
    site = start_site("--retry", retry)
    addr = ("127.0.0.1", site.port)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    sent = 0
    probes = []
    for size in [17, 18, 30, 60, 120, 400, 1199]:
        probes += [zero_rtt(size) for _ in range(10)]
    probes += [zero_rtt(1300) for _ in range(10)]  # big 0-RTT before an Initial: dropped too
    for size in [40, 100, 500, 1000, 1199]:
        probes += [initial(V1, size) for _ in range(10)]
    for version in [DRAFT29, V2_DRAFT, 0x1A2A3A4A]:
        for size in [40, 300, 1199]:
            probes += [initial(version, size) for _ in range(5)]
    for p in probes:
        s.sendto(p, addr)
        sent += len(p)
    small = drain(s)
    assert small == [], f"{len(small)} answers to datagrams that may not get one: {small[:3]!r}"

    # Datagrams of 1200 bytes and more: what they may get, and never more than 3x.
    big_sent = 0
    vn_probes = []
    for version in [DRAFT29, V2_DRAFT, 0x1A2A3A4A]:
        dcid, scid = os.urandom(8), os.urandom(8)
        p = initial(version, 1200, dcid, scid)
        vn_probes.append((dcid, scid))
        s.sendto(p, addr)
        big_sent += len(p)
    for _ in range(20):  # v1 Initials that do not decrypt: Retry (on / auto-flood) or nothing
        p = initial(V1, 1200)
        s.sendto(p, addr)
        big_sent += len(p)
    back = drain(s)
    got = sum(len(b) for b in back)
    print(f"\nretry={retry}: small {sent} bytes -> 0; big {big_sent} bytes -> {got} bytes "
          f"in {len(back)} datagrams")
    assert got <= 3 * big_sent
    vns = [b for b in back if b[1:5] == b"\0\0\0\0"]
    assert len(vns) == 3, back
    for vn in vns:
        assert vn[0] & 0x80
        dcid, scid = vn[6:14], vn[15:23]
        assert (scid, dcid) in vn_probes, vn  # the client's CIDs, swapped
        assert vn[23:] == struct.pack("!I", V1), vn  # v1 only
    st = stats(site, tmp_path)
    print(st)
    assert st["version_negotiations"] >= 3
    assert st["connections"] <= 1  # only the stats request's
    # A real client is served all along.
    d, out = fetch(site, ["/whoami"], tmp_path)
    assert read(d, "whoami") == f"pid={site.proc.pid} slot=0\n".encode(), out


def test_draft29_and_v2_get_version_negotiation_not_a_connection(start_site, tmp_path):
    # gtlsclient speaking draft-29 / the v2 draft: ngtcp2 0.12 on the server would run them; we
    # answer Version Negotiation (v1) and the client, which supports v1, moves to it.
    site = start_site()
    for version in ["0xff00001d", "0x709a50c4"]:
        d, out = fetch(site, ["/whoami"], tmp_path, f"--version={version}", "--no-http-dump",
                       quiet=False)
        assert "VN v=0x00000001" in out, out[-2000:]  # the server's list: v1, nothing else
        assert f"version={version}" in out and "type=Handshake" not in out, out[-2000:]
    st = stats(site, tmp_path)
    assert st["version_negotiations"] >= 2, st


def test_retries_are_rate_limited(start_site, tmp_path):
    site = start_site("--retry", "on", "--retries-per-sec", "20")
    addr = ("127.0.0.1", site.port)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    n = 300
    for _ in range(n):
        s.sendto(initial(V1, 1200), addr)
    back = drain(s)
    retries = [b for b in back if b[0] & 0xF0 == 0xF0 and b[1:5] == struct.pack("!I", V1)]
    st = stats(site, tmp_path)
    print(f"\n{n} Initials -> {len(retries)} Retries; {st}")
    # A burst of one second's worth, and what refilled while we sent; far from one each.
    assert len(retries) < n // 3, len(retries)
    assert st["retries_limited"] >= n - len(retries) - 1, st


def capture_initial(tmp_path):
    """The first datagram gtlsclient sends: a real, protected client Initial (ALPN h3)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(10)
    port = s.getsockname()[1]
    client = subprocess.Popen(
        [CLIENT, "-q", "--timeout=5s", "127.0.0.1", str(port), f"https://localhost:{port}/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        data, _ = s.recvfrom(65536)
    finally:
        client.kill()
        client.wait()
        s.close()
    assert data[0] & 0xF0 == 0xC0 and data[1:5] == struct.pack("!I", V1) and len(data) >= 1200
    return data


def test_spoofed_initial_flood_keeps_memory_bounded_and_serves(start_site, tmp_path):
    # ASan keeps freed memory in quarantine (256 MiB by default): a small one, so that RSS shows
    # what the server holds.
    asan = os.environ.get("ASAN_OPTIONS", "")
    site = start_site(env={"ASAN_OPTIONS": f"{asan}:quarantine_size_mb=4".lstrip(":")})
    pkts = [capture_initial(tmp_path) for _ in range(3)]
    addr = ("127.0.0.1", site.port)
    rss0 = rss_kib(site.proc.pid, missing=0)
    # One socket on 0.0.0.0 that never answers; each datagram leaves from its own 127.x.y.z, so
    # every (DCID, source) pair is a new connection to the server, and what the server sends
    # back (to 127.x.y.z, same port) lands here and is counted.
    flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flood.bind(("0.0.0.0", 0))
    flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    stop = threading.Event()
    counts = {"sent": 0, "sent_bytes": 0, "back": 0, "back_bytes": 0}
    peak = [rss0]

    def sender():
        i = 0
        while not stop.is_set():
            for _ in range(25):
                i += 1
                src = f"127.{1 + (i >> 16) % 200}.{(i >> 8) & 255}.{i & 255 or 1}"
                p = pkts[i % len(pkts)]
                ancillary = [(socket.IPPROTO_IP, IP_PKTINFO,
                              struct.pack("I4s4s", 0, socket.inet_aton(src), bytes(4)))]
                try:
                    flood.sendmsg([p], ancillary, 0, addr)
                    counts["sent"] += 1
                    counts["sent_bytes"] += len(p)
                except OSError:
                    pass
            time.sleep(0.01)  # ~2,500 Initials/s at most (what issue 11 measured)

    def receiver():
        flood.settimeout(0.2)
        while not stop.is_set():
            try:
                data = flood.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            counts["back"] += 1
            counts["back_bytes"] += len(data)

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(site.proc.pid, missing=0))
            time.sleep(0.05)

    threads = [threading.Thread(target=f, daemon=True) for f in (sender, receiver, watch)]
    for t in threads:
        t.start()
    fetches, took = [], []
    t0 = time.monotonic()
    try:
        # Until the flood has sent 3,000 Initials and the client made 3 fetches under it (a
        # loaded machine sends slower: the bound is a count, not a time).
        while counts["sent"] < 3000 or len(fetches) < 3:
            assert time.monotonic() - t0 < 120, (counts, len(fetches))
            t1 = time.monotonic()
            d, out = fetch(site, ["/whoami"], tmp_path, timeout=30)
            fetches.append((read(d, "whoami"), out))
            took.append(time.monotonic() - t1)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    st = stats(site, tmp_path)
    flood.close()
    print(f"\nflood: {counts['sent']} Initials ({counts['sent_bytes']} bytes) from spoofed "
          f"sources, {counts['back']} datagrams ({counts['back_bytes']} bytes) back; "
          f"RSS {rss0} KiB -> peak {peak[0]} KiB; {len(fetches)} client fetches "
          f"({', '.join(f'{t:.2f}' for t in took)} s); {st}")
    good = f"pid={site.proc.pid} slot=0\n".encode()
    bad = [out for body, out in fetches if body != good]
    assert not bad, bad[0][-2000:]
    assert counts["back_bytes"] <= 3 * counts["sent_bytes"]
    assert st["retries_sent"] > 0, st
    # The spoofed handshakes hold at most max_unvalidated (256) connections' state; the rest are
    # the client's (the stats request's, and fetches still in their closing period).
    assert st["handshakes_unvalidated"] <= 256, st
    assert st["connections"] <= 256 + len(fetches) + 1, st
    assert peak[0] - rss0 < 200 * 1024, (rss0, peak[0])


def test_request_stream_closed_before_headers_is_a_stream_error(start_site, tmp_path):
    """A request stream closed before its HEADERS is a stream error; one whose declared body is
    over the limit is 413 at once; the connection serves on."""
    if not os.path.exists(RAWCLIENT):
        pytest.skip("h3_rawclient not built")
    site = start_site()
    r = subprocess.run([RAWCLIENT, "127.0.0.1", str(site.port)], capture_output=True, timeout=30)
    out = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
    print(out)
    # The empty request stream is reset with H3_REQUEST_INCOMPLETE (0x10d); the next request on
    # the same connection is answered.
    assert "stream 0 reset 0x10d" in out, out
    assert f"stream 4 body pid={site.proc.pid} slot=0" in out, out
    # A declared body over max_body is 413 from the head alone (the client sends none, and never
    # ends the stream), and the server stops reading it: its STOP_SENDING (H3_NO_ERROR, 0x100)
    # ends our sending side, so the stream closes with that code.
    assert "stream 8 body Content Too Large" in out, out
    assert "stream 8 closed 0x100" in out, out
    assert "connection closed" not in out, out
    assert r.returncode == 0, out
    assert stats(site, tmp_path)["requests_incomplete"] == 1
    site.stop()
    assert any("request_refused" in line and "status=413" in line and "body too large" in line
               for line in site.log().splitlines()), site.log()
