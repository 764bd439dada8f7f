"""Automatic HTTPS (ACME, RFC 8555) against a real ACME server: Debian's pebble on loopback.

  * HTTP-01 and TLS-ALPN-01: corral (`[tls] acme`, one challenge type each) obtains a certificate
    for "localhost" from pebble, which validates by connecting to corral's plain and TLS ports;
    curl then verifies what corral's TLS port serves against pebble's root (from its management
    endpoint /roots/0); the key and the chain are 0600 in the state directory;
  * the CA unreachable with until_issued = "refuse": the order fails with a log line and is
    retried, TLS handshakes are refused meanwhile, and the plain port keeps serving.

pebble's own HTTPS listener uses a certificate made by `corral cert` (Debian's pebble ships no
test certificate), which is also what corral trusts for the directory (`ca_file`).
"""
import json
import os
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


def start_pebble(tmp_path, processes, http_port, tls_port):
    cert, key = make_cert(tmp_path / "pebble-cert")
    acme_port, mgmt_port = free_port(), free_port()
    config = {"pebble": {
        "listenAddress": f"127.0.0.1:{acme_port}",
        "managementListenAddress": f"127.0.0.1:{mgmt_port}",
        "certificate": cert, "privateKey": key,
        "httpPort": http_port, "tlsPort": tls_port,
        "ocspResponderURL": "", "externalAccountBindingRequired": False}}
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

    # pebble's root, from its management endpoint (served with the certificate we gave it).
    ctx = ssl.create_default_context(cafile=pebble_cert)
    with urllib.request.urlopen(f"https://localhost:{mgmt_port}/roots/0", context=ctx,
                                timeout=10) as r:
        root = r.read()
    root_path = tmp_path / "pebble-root.pem"
    root_path.write_bytes(root)

    # The server process takes the new certificate at its next handshake, without a restart.
    result = poll(lambda: (lambda r: r if r.returncode == 0 and r.stdout == "200" else None)(
        curl(f"https://localhost:{tls_port}/", str(root_path))),
        timeout=ceiling(10), what="curl verifying against pebble's root",
        detail=lambda: curl(f"https://localhost:{tls_port}/", str(root_path)).stderr)
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
