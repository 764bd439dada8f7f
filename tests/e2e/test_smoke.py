"""A first look: the test site answers, and the corral binary serves its embedded default."""
import subprocess
import urllib.request

from conftest import CORRAL_BIN, read_response
from corral_test_util import ceiling


def test_testsite_hello(site):
    with urllib.request.urlopen(site.url + "/hello", timeout=5) as r:
        assert r.status == 200
        assert r.read() == b"hello"


def test_corral_embedded_default(server_factory):
    srv = server_factory(binary=CORRAL_BIN)
    s = srv.connect()
    s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, body, _ = read_response(s)
    assert status == 200
    assert b"corral is running" in body
    assert "nonce-" in headers["content-security-policy"]
    # For a phone and a browser tab: the viewport, an icon that is there, the version, the docs.
    page = body.decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert '<link rel="icon" href="/favicon.ico" type="image/svg+xml">' in page
    version = subprocess.run([CORRAL_BIN, "--version"], capture_output=True, text=True,
                             timeout=ceiling(10)).stdout.split()[-1]
    assert f"corral {version}." in page, page
    assert "<code>docs/config.md</code>" in page and "<code>README.md</code>" in page
    s.sendall(b"GET /favicon.ico HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, body, _ = read_response(s)
    assert status == 200, body
    assert headers["content-type"] == "image/svg+xml"
    assert body.startswith(b"<svg ") and body.endswith(b"</svg>")
