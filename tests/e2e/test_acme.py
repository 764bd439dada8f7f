"""Automatic HTTPS (ACME, RFC 8555) against a real ACME server: Debian's pebble on loopback.

  * HTTP-01 and TLS-ALPN-01: corral (`[tls] acme`, one challenge type each) obtains a certificate
    for "localhost" from pebble, which validates by connecting to corral's plain and TLS ports;
    curl then verifies what corral's TLS port serves against pebble's root (from its management
    endpoint /roots/0); the key and the chain are 0600 in the state directory;
  * renewal: with pebble issuing 18-second certificates, the renewal at two thirds of the life
    swaps the certificate while clients keep making HTTPS connections, none failing; then with
    pebble stopped, the next renewal fails, is retried later, and the current certificate stays;
  * the CA unreachable with until_issued = "refuse": the order fails with a log line and is
    retried, TLS handshakes are refused meanwhile, and the plain port keeps serving.

pebble's own HTTPS listener uses a certificate made by `corral cert` (Debian's pebble ships no
test certificate), which is also what corral trusts for the directory (`ca_file`).
"""
import hashlib
import http.client
import json
import os
import threading
import socket
import ssl
import stat
import subprocess
import urllib.request

import pytest

from conftest import CORRAL_BIN, Server
from corral_test_util import ceiling, free_port, poll

PEBBLE = "/usr/bin/pebble"
pytestmark = pytest.mark.skipif(not os.path.exists(PEBBLE), reason="pebble is not installed")


def start(cmd, log_path, env=None):
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    log.close()
    return Server(proc, "127.0.0.1", None, log_path)


@pytest.fixture
def processes():
    started = []
    yield started
    for p in reversed(started):
        p.stop()


def make_cert(directory):
    subprocess.run([CORRAL_BIN, "cert", "--dir", str(directory)], capture_output=True,
                   timeout=30, check=True)
    return str(directory / "dev-cert.pem"), str(directory / "dev-key.pem")


def start_pebble(tmp_path, processes, http_port, tls_port, validity=None):
    cert, key = make_cert(tmp_path / "pebble-cert")
    acme_port, mgmt_port = free_port(), free_port()
    config = {"pebble": {
        "listenAddress": f"127.0.0.1:{acme_port}",
        "managementListenAddress": f"127.0.0.1:{mgmt_port}",
        "certificate": cert, "privateKey": key,
        "httpPort": http_port, "tlsPort": tls_port,
        "ocspResponderURL": "", "externalAccountBindingRequired": False}}
    if validity:
        config["pebble"]["certificateValidityPeriod"] = validity
    path = tmp_path / "pebble.json"
    path.write_text(json.dumps(config))
    pebble = start([PEBBLE, "-config", str(path)], str(tmp_path / "pebble.log"),
                   env={"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_VA_ALWAYS_VALID": "0",
                        "PEBBLE_AUTHZREUSE": "0"})
    processes.append(pebble)
    pebble.wait_log(r"ACME directory available", timeout=ceiling(15))
    return pebble, cert, f"https://localhost:{acme_port}/dir", mgmt_port


def start_corral(tmp_path, processes, http_port, tls_port, acme):
    state = tmp_path / "state"
    config = tmp_path / "corral.toml"
    config.write_text(f"""
listen = "127.0.0.1:{http_port}"
state_dir = "{state}"
[http3]
enabled = false
[tls]
listen = "127.0.0.1:{tls_port}"
acme = {{ {acme} }}
""")
    corral = start([CORRAL_BIN, "serve", "--config", str(config)], str(tmp_path / "corral.log"))
    processes.append(corral)
    corral.wait_log(r"tls_listening address=", timeout=ceiling(20))
    return corral, state


def fetch_root(tmp_path, pebble_cert, mgmt_port):
    """pebble's root, from its management endpoint (served with the certificate we gave it)."""
    ctx = ssl.create_default_context(cafile=pebble_cert)
    with urllib.request.urlopen(f"https://localhost:{mgmt_port}/roots/0", context=ctx,
                                timeout=10) as r:
        root = r.read()
    path = tmp_path / "pebble-root.pem"
    path.write_bytes(root)
    return str(path)


def served_fingerprint(port, cafile):
    """The SHA-256 of the leaf corral's TLS port serves, verified against `cafile`."""
    ctx = ssl.create_default_context(cafile=cafile)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest()


def curl(url, cafile, extra=()):
    return subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert", cafile, "-o",
                           "/dev/null", "-w", "%{http_code}", *extra, url],
                          capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("challenge", ["http-01", "tls-alpn-01"])
def test_certificate_from_pebble_served_to_curl(tmp_path, processes, challenge):
    http_port, tls_port = free_port(), free_port()
    pebble, pebble_cert, directory, mgmt_port = start_pebble(tmp_path, processes, http_port,
                                                             tls_port)
    corral, state = start_corral(
        tmp_path, processes, http_port, tls_port,
        f'directory = "{directory}", email = "ops@example.org", domains = ["localhost"], '
        f'ca_file = "{pebble_cert}", challenges = ["{challenge}"]')
    corral.wait_log(rf"acme_challenge type={challenge} domain=localhost", timeout=ceiling(30))
    corral.wait_log(r"acme_certificate_issued domains=localhost", timeout=ceiling(30))
    assert "acme_order_failed" not in corral.log()
    if challenge == "http-01":
        assert "Attempting to validate w/ HTTP" in pebble.log()
    else:
        assert "acme-tls/1 validation answered" in corral.log()

    root_path = fetch_root(tmp_path, pebble_cert, mgmt_port)

    # The server process takes the new certificate at its next handshake, without a restart.
    result = poll(lambda: (lambda r: r if r.returncode == 0 and r.stdout == "200" else None)(
        curl(f"https://localhost:{tls_port}/", root_path)),
        timeout=ceiling(10), what="curl verifying against pebble's root",
        detail=lambda: curl(f"https://localhost:{tls_port}/", root_path).stderr)
    assert result.stdout == "200"
    assert corral.log().count("process_started") == 1  # no restart, no new generation

    for name in ("cert.pem", "key.pem", "account-key.pem"):
        mode = stat.S_IMODE(os.stat(state / "acme" / name).st_mode)
        assert mode == 0o600, (name, oct(mode))
    # The HTTP-01 path answers 404 for a token nobody published.
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                        f"http://127.0.0.1:{http_port}/.well-known/acme-challenge/nope"],
                       capture_output=True, text=True, timeout=20)
    assert r.stdout == "404"


def test_unreachable_ca_refuses_tls_and_retries(tmp_path, processes):
    http_port, tls_port, dead_port = free_port(), free_port(), free_port()
    corral, state = start_corral(
        tmp_path, processes, http_port, tls_port,
        f'directory = "https://127.0.0.1:{dead_port}/dir", domains = ["localhost"], '
        f'until_issued = "refuse"')
    corral.wait_log(r"acme_order_failed domains=localhost error=\"directory: connect",
                    timeout=ceiling(20))
    corral.wait_log(r"acme_retry in_seconds=\d+", timeout=ceiling(10))
    # No certificate yet: the TLS handshake is refused, the plain port serves.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ctx.wrap_socket(raw, server_hostname="localhost").do_handshake()
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                        f"http://127.0.0.1:{http_port}/"], capture_output=True, text=True,
                       timeout=20)
    assert r.stdout == "200"
    assert not os.path.exists(state / "acme" / "cert.pem")


def test_renewal_swaps_under_load_and_survives_the_ca_down(tmp_path, processes):
    http_port, tls_port = free_port(), free_port()
    pebble, pebble_cert, directory, mgmt_port = start_pebble(tmp_path, processes, http_port,
                                                             tls_port, validity=18)
    corral, state = start_corral(
        tmp_path, processes, http_port, tls_port,
        f'directory = "{directory}", domains = ["localhost"], ca_file = "{pebble_cert}", '
        f'challenges = ["http-01"]')
    corral.wait_log(r"acme_certificate_issued", timeout=ceiling(30))
    corral.wait_log(r"acme_renewal_scheduled", timeout=ceiling(10))
    root = fetch_root(tmp_path, pebble_cert, mgmt_port)
    first = served_fingerprint(tls_port, root)  # published before it was logged

    # Clients keep opening HTTPS connections (each a full handshake, verified against pebble's
    # root) until the renewal at two thirds of the 18 s has been served.
    stop = threading.Event()
    counts = {"ok": 0, "failed": []}
    ctx = ssl.create_default_context(cafile=root)

    def load():
        while not stop.is_set():
            try:
                conn = http.client.HTTPSConnection("localhost", tls_port, context=ctx, timeout=10)
                conn.request("GET", "/")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    counts["ok"] += 1
                else:
                    counts["failed"].append(status)
            except Exception as e:  # noqa: BLE001 - every failure is what the test counts
                counts["failed"].append(repr(e))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        poll(lambda: corral.log().count("acme_certificate_issued") >= 2, timeout=ceiling(30),
             what="the renewal", detail=lambda: corral.log()[-2000:])
        second = poll(lambda: (lambda f: f if f != first else None)(
            served_fingerprint(tls_port, root)), timeout=ceiling(10), what="the new certificate")
        ok_at_swap = counts["ok"]
        poll(lambda: counts["ok"] > ok_at_swap + 5, timeout=ceiling(10), what="more requests")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=20)
    assert counts["failed"] == [], counts["failed"][:5]
    assert counts["ok"] > 10
    assert corral.log().count("process_started") == 1  # no restart, no new generation

    # The CA goes away: the next renewal fails and is retried; the certificate in use stays.
    pebble.stop()
    corral.wait_log(r"acme_order_failed domains=localhost error=\"directory: connect",
                    timeout=ceiling(30))
    corral.wait_log(r"acme_retry in_seconds=30", timeout=ceiling(10))
    assert served_fingerprint(tls_port, root) == second
    assert stat.S_IMODE(os.stat(state / "acme" / "cert.pem").st_mode) == 0o600
