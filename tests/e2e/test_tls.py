"""HTTPS over TCP (the tls component) with real clients: curl, Python's ssl, websockets.

  * corral with the dev certificate: curl --cacert over keep-alive, the pin in the log matches
    `corral cert`; a bad certificate or key is one config line and exit 78;
  * the test site with a TLS listener: pipelined requests over one TLS connection, a 5 MiB file
    and a Range request, TLS 1.2-only and TLS 1.3-only clients, ALPN http/1.1, scheme https;
  * plain HTTP (and garbage) on the TLS port is closed and logged, the next client is served;
  * a WebSocket echo over TLS;
  * --processes 2: a session ticket from one connection resumes on later ones (whichever process
    takes them), and a different corral (another ticket key) does not resume it;
  * SIGHUP with a new certificate: new connections get it while a response in flight on an old
    connection completes.
"""
import asyncio
import hashlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import read_response, read_responses, recv_all


def tls_port(srv, timeout=10.0):
    return int(srv.wait_log(r"tls_listening address=[\d.]+:(\d+)", timeout=timeout).group(1))


def client_context(cafile, **kw):
    ctx = ssl.create_default_context(cafile=cafile)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx


def tls_connect(port, ctx, session=None, server_hostname="localhost"):
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=server_hostname, session=session)


def make_cert(directory):
    """A second self-signed certificate for localhost (via `corral cert`)."""
    out = subprocess.run([CORRAL_BIN, "cert", "--dir", str(directory)], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return (os.path.join(str(directory), "dev-cert.pem"),
            os.path.join(str(directory), "dev-key.pem"), out)


def peer_fingerprint(port, cafile=None):
    """The SHA-256 of the certificate the server presents (verified against `cafile` if given)."""
    if cafile is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = client_context(cafile)
    with tls_connect(port, ctx) as s:
        return hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest()


def pem_fingerprint(path):
    with open(path) as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    return hashlib.sha256(der).hexdigest()


def curl(*args, timeout=20):
    return subprocess.run(["curl", "-sS", "--max-time", "10", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def tls_site(server_factory, tmp_path):
    """The test site with a static root and a TLS listener using a fresh dev certificate."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello over tls\n")
    (root / "five.bin").write_bytes(os.urandom(5 * 1024 * 1024))
    cert, key, _ = make_cert(tmp_path / "cert")
    srv = server_factory("--root", str(root), "--tls-listen", "127.0.0.1:0", "--tls-cert", cert,
                         "--tls-key", key)
    srv.tls_port = tls_port(srv)
    srv.cert = cert
    srv.root = root
    return srv


def test_corral_dev_cert_curl_keepalive(server_factory, tmp_path):
    state = tmp_path / "state"
    srv = server_factory("--tls-listen", "127.0.0.1:0", "--state-dir", str(state),
                         binary=CORRAL_BIN)
    port = tls_port(srv)
    cert = state / "tls" / "dev-cert.pem"
    assert cert.exists() and (state / "tls" / "dev-key.pem").stat().st_mode & 0o777 == 0o600
    # The log names the certificate and its pin; `corral cert` prints the same pin.
    pin = srv.wait_log(r"tls_credentials cert=\S+dev-cert.pem .*dev=true spki_sha256=(\S+)").group(1)
    _, _, out = make_cert(state / "tls")
    assert f"spki_sha256: {pin}" in out
    for host in ("localhost", "127.0.0.1"):
        r = curl("-v", "--cacert", str(cert), f"https://{host}:{port}/", f"https://{host}:{port}/",
                 f"https://{host}:{port}/", "-o", "/dev/null", "-o", "/dev/null", "-o",
                 "/dev/null", "-w", "%{http_code} %{num_connects} %{scheme}\n")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.split()
        assert lines == ["200", "1", "HTTPS", "200", "0", "HTTPS", "200", "0", "HTTPS"], r.stdout
        assert "ALPN: server accepted http/1.1" in r.stderr
    # Without the CA file curl refuses the self-signed certificate: verification is real.
    r = curl(f"https://localhost:{port}/", "-o", "/dev/null")
    assert r.returncode == 60, (r.returncode, r.stderr)


def test_bad_certificate_is_a_config_error(tmp_path):
    a_cert, a_key, _ = make_cert(tmp_path / "a")
    _, b_key, _ = make_cert(tmp_path / "b")
    base = [CORRAL_BIN, "serve", "--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0",
            "--state-dir", str(tmp_path / "state")]
    r = subprocess.run(base + ["--cert", a_cert, "--key", b_key], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 78
    assert "tls.key" in r.stderr and b_key in r.stderr and "does not match" in r.stderr
    missing = str(tmp_path / "missing.pem")
    r = subprocess.run(base + ["--cert", missing, "--key", a_key], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 78
    assert r.stderr.strip().count("\n") == 0 and missing in r.stderr and "tls.cert" in r.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[tls]\nlisten = "127.0.0.1:0"\ncert = "{a_cert}"\n')
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 78 and "tls.cert, tls.key" in r.stderr


def test_pipelined_requests_over_one_tls_connection(tls_site):
    s = tls_connect(tls_site.tls_port, client_context(tls_site.cert))
    tls_site.clients.append(s)
    reqs = b"".join(f"GET {p} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
                    for p in ("/files/hello.txt", "/canary/count", "/files/hello.txt",
                              "/files/nope"))
    s.sendall(reqs)
    got = [(status, body) for status, _, body in read_responses(s, 4)[0]]
    assert got[0] == (200, b"hello over tls\n")
    assert got[1][0] == 200
    assert got[2] == (200, b"hello over tls\n")
    assert got[3][0] == 404


def test_big_file_and_range_over_tls(tls_site):
    data = (tls_site.root / "five.bin").read_bytes()
    conn = http.client.HTTPSConnection("localhost", tls_site.tls_port, timeout=20,
                                       context=client_context(tls_site.cert))
    conn.request("GET", "/files/five.bin")
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200 and len(body) == len(data) and body == data
    conn.request("GET", "/files/five.bin", headers={"Range": "bytes=1000000-3999999"})
    r = conn.getresponse()
    assert r.status == 206
    assert r.getheader("Content-Range") == f"bytes 1000000-3999999/{len(data)}"
    assert r.read() == data[1000000:4000000]
    conn.request("GET", "/files/hello.txt")  # the same connection after both
    assert conn.getresponse().read() == b"hello over tls\n"
    conn.close()


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_tls_versions_with_curl_and_python(tls_site, version):
    url = f"https://localhost:{tls_site.tls_port}/files/hello.txt"
    flags = ["--tlsv1.2", "--tls-max", "1.2"] if version == "1.2" else ["--tlsv1.3"]
    r = curl("-v", "--cacert", tls_site.cert, *flags, url)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello over tls\n"
    assert f"SSL connection using TLSv{version}" in r.stderr
    v = ssl.TLSVersion.TLSv1_2 if version == "1.2" else ssl.TLSVersion.TLSv1_3
    ctx = client_context(tls_site.cert, minimum_version=v, maximum_version=v)
    with tls_connect(tls_site.tls_port, ctx) as s:
        assert s.version() == f"TLSv{version}"
        s.sendall(b"GET /files/hello.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert recv_all(s).endswith(b"hello over tls\n")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_1_1_is_refused(tls_site):
    ctx = client_context(tls_site.cert)
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_connect(tls_site.tls_port, ctx).close()
    assert peer_fingerprint(tls_site.tls_port, tls_site.cert) == pem_fingerprint(tls_site.cert)


def test_alpn_http11_and_scheme(tls_site):
    ctx = client_context(tls_site.cert)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with tls_connect(tls_site.tls_port, ctx) as s:
        assert s.selected_alpn_protocol() == "http/1.1"
        s.sendall(b"GET /scheme HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, _, body, _ = read_response(s)
        assert status == 200 and body == b"https"
    r = curl(f"http://127.0.0.1:{tls_site.port}/scheme")
    assert r.stdout == "http"
    ctx = client_context(tls_site.cert)
    ctx.set_alpn_protocols(["h2"])  # no overlap: no protocol, still served as HTTP/1.1
    with tls_connect(tls_site.tls_port, ctx) as s:
        assert s.selected_alpn_protocol() is None
        s.sendall(b"GET /files/hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert read_response(s)[0] == 200


def test_plain_http_and_garbage_on_tls_port_are_closed(tls_site):
    for junk in (b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", os.urandom(300)):
        s = socket.create_connection(("127.0.0.1", tls_site.tls_port), timeout=5)
        tls_site.clients.append(s)
        s.sendall(junk)
        data = recv_all(s, timeout=5)
        assert b"HTTP/1.1" not in data  # at most a TLS alert, never an HTTP answer
    tls_site.wait_log(r'tls_handshake_failed remote=127\.0\.0\.1 error="[^"]+"')
    # A client that connects and says nothing is closed at the header timeout, not here; the next
    # good client is served.
    r = curl("--cacert", tls_site.cert, f"https://localhost:{tls_site.tls_port}/files/hello.txt")
    assert r.returncode == 0 and r.stdout == "hello over tls\n", r.stderr
    # The plain listener is untouched.
    r = curl(f"http://127.0.0.1:{tls_site.port}/files/hello.txt")
    assert r.stdout == "hello over tls\n"


def test_alt_svc_header_when_configured(server_factory, tls_site, tmp_path):
    assert "alt-svc" not in (h.lower() for h in _head(tls_site.port, None))  # default: none
    cert, key, _ = make_cert(tmp_path / "alt")
    srv = server_factory("--tls-listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key,
                         "--alt-svc", 'h3=":8443"; ma=86400')
    port = tls_port(srv)
    for p, ca in ((srv.port, None), (port, cert)):
        assert _head(p, ca).get("alt-svc") == 'h3=":8443"; ma=86400'


def _head(port, cafile):
    if cafile:
        conn = http.client.HTTPSConnection("localhost", port, timeout=10,
                                           context=client_context(cafile))
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/canary/count")
    r = conn.getresponse()
    r.read()
    conn.close()
    return {k.lower(): v for k, v in r.getheaders()}


def test_websocket_echo_over_tls(tls_site):
    websockets = pytest.importorskip("websockets")

    async def run():
        ctx = client_context(tls_site.cert)
        uri = f"wss://localhost:{tls_site.tls_port}/ws/echo"
        async with websockets.connect(uri, ssl=ctx, max_size=None) as ws:
            await ws.send("hello tls")
            assert await ws.recv() == "hello tls"
            big = os.urandom(300_000)  # many records both ways
            await ws.send(big)
            assert await ws.recv() == big
            for i in range(50):
                await ws.send(f"m{i}")
            for i in range(50):
                assert await ws.recv() == f"m{i}"

    asyncio.run(asyncio.wait_for(run(), 20))


def test_session_resumption_across_processes(server_factory, tmp_path):
    state = tmp_path / "state"
    srv = server_factory("--tls-listen", "127.0.0.1:0", "--state-dir", str(state),
                         "--processes", "2", binary=CORRAL_BIN)
    port = tls_port(srv)
    srv.wait_log(r"process_started slot=1")
    cafile = str(state / "tls" / "dev-cert.pem")
    for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
        ctx = client_context(cafile, maximum_version=version)  # a session belongs to its context
        with tls_connect(port, ctx) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            recv_all(s)  # TLS 1.3 tickets arrive after the handshake, with the first data
            session = s.session
            assert not s.session_reused
        assert session is not None
        # Two processes share the port (SO_REUSEPORT picks by the client's port): with 16
        # connections both take some (the chance that one gets all is 2^-15), and all resume.
        reused = []
        for _ in range(16):
            with tls_connect(port, ctx, session=session) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                recv_all(s)
                reused.append(s.session_reused)
        assert all(reused), (version, reused)

    # Another corral has another ticket key: the same session does not resume there.
    other = server_factory("--tls-listen", "127.0.0.1:0", "--state-dir", str(state),
                           binary=CORRAL_BIN)
    other_port = tls_port(other)
    ctx = client_context(cafile)
    with tls_connect(port, ctx) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        recv_all(s)
        session = s.session
    with tls_connect(other_port, ctx, session=session) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        recv_all(s)
        assert not s.session_reused


def test_sighup_picks_up_a_new_certificate(server_factory, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    data = os.urandom(8 * 1024 * 1024)
    (root / "big.bin").write_bytes(data)
    (root / "index.html").write_text("<p>hi</p>\n")
    live = tmp_path / "live"
    live.mkdir()
    first_cert, first_key, _ = make_cert(tmp_path / "first")
    second_cert, second_key, _ = make_cert(tmp_path / "second")
    assert pem_fingerprint(first_cert) != pem_fingerprint(second_cert)
    cert, key = str(live / "cert.pem"), str(live / "key.pem")
    shutil.copy(first_cert, cert)
    shutil.copy(first_key, key)
    srv = server_factory(str(root), "--tls-listen", "127.0.0.1:0", "--cert", cert, "--key", key,
                         "--state-dir", str(tmp_path / "state"), binary=CORRAL_BIN)
    port = tls_port(srv)
    srv.wait_log(r"process_started slot=0 .*generation=1")
    assert peer_fingerprint(port, first_cert) == pem_fingerprint(first_cert)

    # A keep-alive connection with a response in flight when the SIGHUP comes.
    old = tls_connect(port, client_context(first_cert))
    srv.clients.append(old)
    old.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, _, body, _ = read_response(old)
    assert status == 200 and body == b"<p>hi</p>\n"
    old.sendall(b"GET /big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n")
    old.settimeout(10)
    first = old.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")

    shutil.copy(second_cert, cert)
    shutil.copy(second_key, key)
    srv.signal(signal.SIGHUP)
    srv.wait_log(r"process_started slot=0 .*generation=2")
    deadline = time.monotonic() + 10
    while peer_fingerprint(port) != pem_fingerprint(second_cert):
        assert time.monotonic() < deadline, srv.log()[-2000:]
        time.sleep(0.05)
    # The old connection's response completes, byte for byte, from the old process.
    rest = first
    while b"\r\n\r\n" not in rest:
        rest += old.recv(65536)
    head, _, body = rest.partition(b"\r\n\r\n")
    while len(body) < len(data):
        b = old.recv(1 << 20)
        assert b, f"closed after {len(body)} of {len(data)} bytes"
        body += b
    assert body == data
    # And the new generation serves keep-alive requests with the new certificate.
    with tls_connect(port, client_context(second_cert)) as s:
        for _ in range(3):
            s.sendall(b"GET /index.html HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert read_response(s)[0] == 200

    # A broken certificate on SIGHUP is refused and logged; the current one stays.
    with open(cert, "w") as f:
        f.write("broken\n")
    srv.signal(signal.SIGHUP)
    srv.wait_log(r"reload_refused .*tls\.cert")
    assert peer_fingerprint(port, second_cert) == pem_fingerprint(second_cert)
