"""Chromium loads a page over HTTP/3 from `corral serve --processes 2`, and the page fetches a
byte range of a file over the same connection (gtlsclient cannot send a Range header).

Debian's chromium, headless, forced to QUIC for the origin and pinned to the dev certificate's key
(--ignore-certificate-errors-spki-list). The page's script writes the navigation's protocol into the
body, which --dump-dom prints: it must say h3.
"""
import base64
import hashlib
import shutil
import subprocess
import tempfile

import pytest

from conftest import CORRAL_BIN
from corral_test_util import free_port

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium missing")


def spki_pin(cert_path):
    """base64(sha256(SubjectPublicKeyInfo)) of a PEM certificate, with openssl."""
    pub = subprocess.run(["openssl", "x509", "-in", cert_path, "-noout", "-pubkey"],
                         check=True, stdout=subprocess.PIPE).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pub, check=True,
                         stdout=subprocess.PIPE).stdout
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def test_chromium_loads_page_over_h3(server_factory, tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "probe.html").write_text(
        '<!doctype html><html><body><p id="p">no script</p><p id="r">no range</p>'
        '<script src="/probe.js"></script></body></html>\n')
    (root / "data.bin").write_bytes(bytes(range(256)) * 64)  # 16 KiB, byte i is i % 256
    # The navigation's protocol, then a Range request over the same HTTP/3 connection: its
    # status, Content-Range and the bytes it got, as hex.
    (root / "probe.js").write_text(
        'document.getElementById("p").textContent = "proto=" + '
        'performance.getEntriesByType("navigation")[0].nextHopProtocol;\n'
        'fetch("/data.bin", {headers: {Range: "bytes=300-303"}}).then(async (r) => {\n'
        '  const b = new Uint8Array(await r.arrayBuffer());\n'
        '  const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");\n'
        '  document.getElementById("r").textContent = "range=" + r.status + " " +\n'
        '      r.headers.get("content-range") + " " + hex;\n'
        '});\n')
    state = tmp_path / "state"
    port = free_port()
    config = f"""
state_dir = "{state}"

[tls]
listen = "127.0.0.1:{port}"
"""
    srv = server_factory(str(root), "--processes", "2", binary=CORRAL_BIN, config=config)
    srv.wait_log(r"http3_listening", timeout=10)
    cert = state / "tls" / "dev-cert.pem"
    assert cert.exists(), srv.log()
    pin = spki_pin(str(cert))
    profile = tempfile.mkdtemp(prefix="corral-chromium-")
    netlog = tmp_path / "netlog.json"
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--origin-to-force-quic-on=localhost:{port}",
           f"--ignore-certificate-errors-spki-list={pin}",
           "--host-resolver-rules=MAP localhost 127.0.0.1", f"--log-net-log={netlog}",
           "--virtual-time-budget=5000", "--dump-dom", f"https://localhost:{port}/probe.html"]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    dom = p.stdout.decode(errors="replace")
    print(dom)
    assert "proto=h3" in dom, dom + "\n" + p.stderr.decode(errors="replace")[-2000:]
    # 300..303 are bytes 44..47 (300 % 256 = 44 = 0x2c).
    assert "range=206 bytes 300-303/16384 2c2d2e2f" in dom, dom
    assert "QUIC_SESSION" in netlog.read_text(errors="replace")
    # The page and its script were served over HTTP/3 by corral (access log lines, flushed within
    # 200 ms, say so).
    srv.wait_log(r"target=/probe\.js status=200 .*proto=h3")
    srv.wait_log(r"target=/probe\.html status=200 .*proto=h3")
    srv.wait_log(r"target=/data\.bin status=206 .*proto=h3")
