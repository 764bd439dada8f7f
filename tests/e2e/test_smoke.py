"""A first look: the test site answers, and the corral binary serves its embedded default."""
import urllib.request

from conftest import CORRAL_BIN, read_response


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
