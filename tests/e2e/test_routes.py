"""Routing through the real binary: 404/405, route parameters and their decoding, wraps and
authenticators."""
import pytest
import requests

from corral_test_util import exchange, read_response


def get(srv, path, **headers):
    return requests.get(srv.url + path, headers=headers, timeout=5)


@pytest.mark.parametrize("path", ["/nope", "/hello/extra", "/users", "/users/42/x", "/wrapped"])
def test_unknown_path_404(site, path):
    r = get(site, path)
    assert r.status_code == 404, path
    assert "Allow" not in r.headers
    assert r.text.strip() == "Not Found"


def test_unknown_path_404_for_any_method(site):
    assert requests.post(site.url + "/nope", data=b"x", timeout=5).status_code == 404
    assert requests.delete(site.url + "/nope", timeout=5).status_code == 404


def allow_set(r):
    return {m.strip() for m in r.headers["Allow"].split(",")}


def test_405_with_allow(site):
    r = requests.post(site.url + "/hello", data=b"x", timeout=5)
    assert r.status_code == 405
    assert allow_set(r) >= {"GET", "HEAD"}
    assert "POST" not in allow_set(r)
    r = requests.put(site.url + "/users/1", data=b"x", timeout=5)
    assert r.status_code == 405
    assert allow_set(r) >= {"GET", "HEAD"}
    r = requests.get(site.url + "/upload", timeout=5)
    assert r.status_code == 405
    assert "POST" in allow_set(r)
    assert "GET" not in allow_set(r)


def test_405_keeps_connection_usable(site):
    s = site.connect()
    s.sendall(b"DELETE /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, _, left = read_response(s)
    assert status == 405
    assert "GET" in headers["allow"]
    while b"\r\n\r\n" not in left or not left.endswith(b"hello"):
        chunk = s.recv(65536)
        assert chunk
        left += chunk
    assert left.startswith(b"HTTP/1.1 200 ")
    s.close()


def test_route_param(site):
    r = get(site, "/users/42")
    assert r.status_code == 200
    assert r.json() == {"id": "42"}
    assert get(site, "/users/42?tab=posts").json() == {"id": "42"}
    assert get(site, "/users/a-b_c.d~e").json() == {"id": "a-b_c.d~e"}


def test_encoded_slash_never_separates(site):
    for target in (b"/users/a%2Fb", b"/users/a%2fb", b"/users/%2F"):
        status, _, body = exchange(site, b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert status == 400, target
        assert b'"id"' not in body


def test_param_percent_decoded(site):
    status, _, body = exchange(site, b"GET /users/caf%C3%A9 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200
    assert body.decode("utf-8") == '{"id":"café"}'
    assert get(site, "/users/a%20b").json() == {"id": "a b"}
    # requests percent-encodes the non-ASCII path itself.
    assert get(site, "/users/café").json() == {"id": "café"}


def test_wrap_answers_before_route(site):
    r = get(site, "/wrapped/short")
    assert r.status_code == 200
    assert r.text == "from wrap"
    assert r.headers["X-Wrapped"] == "1"


def test_wrap_after_decorates_route(site):
    r = get(site, "/wrapped/x")
    assert r.status_code == 200
    assert r.text == "route x"
    assert r.headers["X-Wrapped"] == "1"
    r = get(site, "/hello")
    assert "X-Wrapped" not in r.headers


def test_authenticator(site):
    assert get(site, "/whoami").text == "anonymous"
    assert get(site, "/whoami", Authorization="Bearer t").text == "tester"
    assert get(site, "/whoami", Authorization="Bearer wrong").text == "anonymous"
    assert get(site, "/whoami", Authorization="Basic dDp0").text == "anonymous"
    assert get(site, "/json", Authorization="Bearer t").json()["principal"] == "tester"
    assert get(site, "/json").json()["principal"] == ""


def test_principal_does_not_leak_across_keepalive_requests(site):
    with requests.Session() as s:
        assert s.get(site.url + "/whoami", headers={"Authorization": "Bearer t"},
                     timeout=5).text == "tester"
        assert s.get(site.url + "/whoami", timeout=5).text == "anonymous"
