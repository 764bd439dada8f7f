"""Static files: validators and conditional requests, ranges (single, multipart, unsatisfiable,
If-Range), downloads, directory indexes, path safety under the root, large files with real
clients, and `corral serve DIR`.

The `site` fixture serves tmp_path/'www' at /files/* (and /download/* as an attachment).
"""
import email.utils
import hashlib
import os
import re
import subprocess

import pytest
import requests

from conftest import CORRAL_BIN
from corral_test_util import Prefixed, parse_head, read_response, read_responses, recv_all



BIG = bytes(range(256)) * 4096  # the fixture's www/big.bin (1 MiB)


def raw_get(srv, target, method="GET", extra=b""):
    """One request on a fresh connection, target sent byte for byte (no client normalization)."""
    s = srv.connect()
    try:
        s.sendall(method.encode() + b" " + target + b" HTTP/1.1\r\nHost: localhost\r\n" + extra +
                  b"Connection: close\r\n\r\n")
        data = recv_all(s, timeout=5)
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, headers = parse_head(head)
    return int(status_line.split(" ")[1]), headers, body


def get(srv, path, **headers):
    return requests.get(srv.url + path, headers=headers, timeout=5)


# --- validators and conditional requests ------------------------------------------------------


def test_file_with_validators_and_type(site, tmp_path):
    r = get(site, "/files/hello.txt")
    assert r.status_code == 200
    assert r.content == b"hello file\n"
    assert r.headers["Content-Type"].startswith("text/plain")
    assert r.headers["Content-Length"] == "11"
    assert r.headers["Accept-Ranges"] == "bytes"
    etag = r.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]+-[0-9a-f]+"', etag), etag
    lm = email.utils.parsedate_to_datetime(r.headers["Last-Modified"])
    mtime = os.stat(tmp_path / "www" / "hello.txt").st_mtime
    assert abs(lm.timestamp() - int(mtime)) <= 1
    r = get(site, "/files/index.html")
    assert r.headers["Content-Type"].startswith("text/html")
    r = get(site, "/files/big.bin")
    assert r.headers["Content-Type"] == "application/octet-stream"


def test_etag_changes_with_content(site, tmp_path):
    e1 = get(site, "/files/hello.txt").headers["ETag"]
    (tmp_path / "www" / "hello.txt").write_text("hello file, longer now\n")
    r = get(site, "/files/hello.txt")
    assert r.content == b"hello file, longer now\n"
    assert r.headers["ETag"] != e1


def test_304_if_none_match(site):
    etag = get(site, "/files/hello.txt").headers["ETag"]
    for value in (etag, f'"nope", {etag}', f"W/{etag}", "*"):
        r = get(site, "/files/hello.txt", **{"If-None-Match": value})
        assert r.status_code == 304, value
        assert r.content == b""
        assert r.headers["ETag"] == etag
    r = get(site, "/files/hello.txt", **{"If-None-Match": '"other"'})
    assert r.status_code == 200 and r.content == b"hello file\n"


def test_304_if_modified_since(site):
    lm = get(site, "/files/hello.txt").headers["Last-Modified"]
    r = get(site, "/files/hello.txt", **{"If-Modified-Since": lm})
    assert r.status_code == 304
    assert r.content == b""
    assert r.headers["Last-Modified"] == lm
    r = get(site, "/files/hello.txt", **{"If-Modified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"})
    assert r.status_code == 200 and r.content == b"hello file\n"
    # If-None-Match takes precedence over If-Modified-Since (RFC 9110 §13.1.3).
    r = get(site, "/files/hello.txt", **{"If-Modified-Since": lm, "If-None-Match": '"other"'})
    assert r.status_code == 200


def test_304_raw_has_no_body(site):
    etag = get(site, "/files/hello.txt").headers["ETag"]
    s = site.connect()
    s.sendall(b"GET /files/hello.txt HTTP/1.1\r\nHost: localhost\r\nIf-None-Match: " +
              etag.encode() + b"\r\n\r\nGET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    s.settimeout(5)
    while buf.count(b"\r\n\r\n") < 2 or not buf.endswith(b"hello"):
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    first, _, rest = buf.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 304 ")
    assert b"content-length: 11" not in first.lower()
    assert rest.startswith(b"HTTP/1.1 200 ")
    s.close()


# --- ranges -----------------------------------------------------------------------------------


def test_single_range(site):
    r = get(site, "/files/big.bin", Range="bytes=1000-1999")
    assert r.status_code == 206
    assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(BIG)}"
    assert r.headers["Content-Length"] == "1000"
    assert r.content == BIG[1000:2000]
    r = get(site, "/files/big.bin", Range="bytes=-10")
    assert r.status_code == 206 and r.content == BIG[-10:]
    assert r.headers["Content-Range"] == f"bytes {len(BIG) - 10}-{len(BIG) - 1}/{len(BIG)}"
    r = get(site, "/files/big.bin", Range=f"bytes={len(BIG) - 3}-")
    assert r.status_code == 206 and r.content == BIG[-3:]
    # A last byte past the end is clipped to the end.
    r = get(site, "/files/hello.txt", Range="bytes=6-100")
    assert r.status_code == 206 and r.content == b"file\n"
    assert r.headers["Content-Range"] == "bytes 6-10/11"


def parse_multipart(content_type, body):
    m = re.fullmatch(r"multipart/byteranges; ?boundary=\"?([^\";]+)\"?", content_type)
    assert m, content_type
    delim = b"--" + m.group(1).encode()
    pieces = body.split(b"\r\n" + delim)
    # Before the first delimiter: nothing (or a preamble); after the last: "--\r\n".
    assert pieces[-1].startswith(b"--"), pieces[-1][:40]
    parts = []
    first = pieces[0]
    if first.startswith(delim):  # no CRLF before the first delimiter
        pieces = [b""] + [first[len(delim):]] + pieces[1:]
    for piece in pieces[1:-1]:
        assert piece.startswith(b"\r\n")
        head, sep, data = piece[2:].partition(b"\r\n\r\n")
        assert sep
        headers = {}
        for line in head.decode().split("\r\n"):
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        parts.append((headers, data))
    return parts


def test_multiple_ranges_multipart(site):
    r = get(site, "/files/big.bin", Range="bytes=0-9, 5000-5099,-7")
    assert r.status_code == 206
    assert "Content-Range" not in r.headers
    assert int(r.headers["Content-Length"]) == len(r.content)
    parts = parse_multipart(r.headers["Content-Type"], r.content)
    want = [(0, 9), (5000, 5099), (len(BIG) - 7, len(BIG) - 1)]
    assert len(parts) == len(want)
    for (headers, data), (a, b) in zip(parts, want):
        assert headers["content-range"] == f"bytes {a}-{b}/{len(BIG)}"
        assert headers["content-type"] == "application/octet-stream"
        assert data == BIG[a:b + 1]


def test_unsatisfiable_range_416(site):
    r = get(site, "/files/big.bin", Range=f"bytes={len(BIG)}-{len(BIG) + 100}")
    assert r.status_code == 416
    assert r.headers["Content-Range"] == f"bytes */{len(BIG)}"
    assert BIG[:64] not in r.content
    r = get(site, "/files/hello.txt", Range="bytes=50-")
    assert r.status_code == 416
    assert r.headers["Content-Range"] == "bytes */11"


def test_malformed_range_ignored(site):
    # A Range header that does not parse is ignored (RFC 9110 §14.2): the whole file.
    r = get(site, "/files/hello.txt", Range="lines=1-2")
    assert r.status_code == 200 and r.content == b"hello file\n"


def test_if_range(site):
    etag = get(site, "/files/big.bin").headers["ETag"]
    r = get(site, "/files/big.bin", Range="bytes=10-19", **{"If-Range": etag})
    assert r.status_code == 206 and r.content == BIG[10:20]
    r = get(site, "/files/big.bin", Range="bytes=10-19", **{"If-Range": '"stale-etag"'})
    assert r.status_code == 200
    assert "Content-Range" not in r.headers
    assert r.content == BIG


def test_preconditions_412(site):
    etag = get(site, "/files/hello.txt").headers["ETag"]
    assert get(site, "/files/hello.txt", **{"If-Match": etag}).status_code == 200
    assert get(site, "/files/hello.txt", **{"If-Match": "*"}).status_code == 200
    r = get(site, "/files/hello.txt", **{"If-Match": '"zzz"'})
    assert r.status_code == 412
    assert b"hello file" not in r.content
    r = get(site, "/files/hello.txt",
            **{"If-Unmodified-Since": "Sat, 01 Jan 2000 00:00:00 GMT"})
    assert r.status_code == 412


def test_head_multiple_ranges(site):
    g = get(site, "/files/big.bin", Range="bytes=0-9,100-109")
    h = requests.head(site.url + "/files/big.bin", headers={"Range": "bytes=0-9,100-109"},
                      timeout=5)
    assert h.status_code == 206
    assert h.content == b""
    assert h.headers["Content-Type"].startswith("multipart/byteranges")
    assert h.headers["Content-Length"] == g.headers["Content-Length"]


def test_pipelined_files_and_routes_in_order(site, tmp_path):
    data = os.urandom(3 * 1024 * 1024)
    (tmp_path / "www" / "rand.bin").write_bytes(data)
    s = site.connect()
    h = b"Host: localhost\r\n"
    s.sendall(b"GET /files/rand.bin HTTP/1.1\r\n" + h + b"\r\n"
              b"GET /hello HTTP/1.1\r\n" + h + b"\r\n"
              b"GET /files/rand.bin HTTP/1.1\r\n" + h + b"Range: bytes=0-9,100-109\r\n\r\n"
              b"GET /slow?ms=100 HTTP/1.1\r\n" + h + b"\r\n"
              b"GET /download/hello.txt HTTP/1.1\r\n" + h + b"Range: bytes=0-4\r\n\r\n"
              b"GET /users/2 HTTP/1.1\r\n" + h + b"\r\n")
    got, left = read_responses(s, 6)
    assert got[0][0] == 200 and hashlib.sha256(got[0][2]).digest() == hashlib.sha256(data).digest()
    assert got[1][0:3:2] == (200, b"hello")
    assert got[2][0] == 206
    parts = parse_multipart(got[2][1]["content-type"], got[2][2])
    assert [d for _, d in parts] == [data[0:10], data[100:110]]
    assert got[3][0:3:2] == (200, b"slow done\n")
    assert got[4][0:3:2] == (206, b"hello")
    assert got[4][1]["content-disposition"].startswith("attachment;")
    assert got[5][0:3:2] == (200, b'{"id":"2"}')
    assert left == b""


# --- downloads, directories -------------------------------------------------------------------


def test_download_content_disposition(site):
    r = get(site, "/download/hello.txt")
    assert r.status_code == 200 and r.content == b"hello file\n"
    cd = r.headers["Content-Disposition"]
    assert cd == ("attachment; filename=\"r_sum_ _x_.txt\"; "
                  "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22x%22.txt")
    r = get(site, "/download/missing.txt")
    assert r.status_code == 404
    assert "Content-Disposition" not in r.headers


def test_directory_index_and_redirect(site):
    r = get(site, "/files/sub/")
    assert r.status_code == 200
    assert r.content == b"<p>sub index</p>\n"
    assert r.headers["Content-Type"].startswith("text/html")
    r = get(site, "/files/")
    assert r.status_code == 200 and r.content == b"<h1>index</h1>\n"
    status, headers, body = raw_get(site, b"/files/sub")
    assert status == 301
    assert headers["location"] == "/files/sub/"
    status, headers, _ = raw_get(site, b"/files/sub?a=1")
    assert status == 301
    assert headers["location"] == "/files/sub/?a=1"
    # requests follows the redirect to the index.
    r = get(site, "/files/sub")
    assert r.status_code == 200 and r.content == b"<p>sub index</p>\n"


def test_directory_redirect_keeps_target_encoding(site, tmp_path):
    for name in ("sp ace", "a?b"):
        (tmp_path / "www" / name).mkdir()
        (tmp_path / "www" / name / "index.html").write_text(name)
    status, headers, _ = raw_get(site, b"/files/sp%20ace")
    assert status == 301 and headers["location"] == "/files/sp%20ace/"
    # Decoding the path into the Location would turn "%3F" into a query.
    status, headers, _ = raw_get(site, b"/files/a%3Fb")
    assert status == 301 and headers["location"] == "/files/a%3Fb/"
    assert get(site, "/files/a%3Fb/").text == "a?b"


def test_directory_without_index(site, tmp_path):
    (tmp_path / "www" / "empty").mkdir()
    (tmp_path / "www" / "empty" / "a.txt").write_text("a")
    r = get(site, "/files/empty/")
    assert r.status_code in (403, 404)
    assert b"a.txt" not in r.content  # no listing


# --- path safety ------------------------------------------------------------------------------

PASSWD_MARK = b"root:"


@pytest.mark.parametrize("target", [
    b"/files/../etc/passwd",
    b"/files/../../../../../../etc/passwd",
    b"/files/%2e%2e/etc/passwd",
    b"/files/%2E%2E/%2E%2E/%2E%2E/etc/passwd",
    b"/files/.%2e/.%2e/.%2e/etc/passwd",
    b"/files/sub/../../../etc/passwd",
    b"/files/%2Fetc%2Fpasswd",
    b"/files/%2fetc/passwd",
    b"/files//etc/passwd",
    b"/files/..%2F..%2F..%2Fetc%2Fpasswd",
    b"/files/hello.txt%00",
    b"/files/hello.txt%00.html",
    b"/files/%00",
    b"/files/..\\..\\etc\\passwd",
    b"/files/%5c..%5c..%5cetc%5cpasswd",
])
def test_no_escape_from_root(site, target):
    status, _, body = raw_get(site, target)
    assert status in (400, 404), (target, status)
    assert PASSWD_MARK not in body


def test_symlinks_leading_out_are_refused(site, tmp_path):
    www = tmp_path / "www"
    os.symlink("/etc/passwd", www / "passwd-link")
    os.symlink("/etc", www / "etc-link")
    os.symlink("../../../../../../../etc/passwd", www / "relative-out")
    os.symlink("../..", www / "sub" / "up")
    for target in (b"/files/passwd-link", b"/files/etc-link/passwd", b"/files/relative-out",
                   b"/files/sub/up/etc/passwd", b"/download/passwd-link"):
        status, _, body = raw_get(site, target)
        assert status in (400, 403, 404), (target, status)
        assert PASSWD_MARK not in body
    # HEAD leaks nothing either (e.g. the size).
    status, headers, _ = raw_get(site, b"/files/passwd-link", method="HEAD")
    assert status in (400, 403, 404)
    assert "etag" not in headers


def test_special_files_refused(site, tmp_path):
    fifo = tmp_path / "www" / "pipe"
    os.mkfifo(fifo)
    status, _, _ = raw_get(site, b"/files/pipe")  # must not block the server on the FIFO
    assert status in (403, 404)
    assert get(site, "/files/hello.txt").status_code == 200


# --- large files, HEAD ------------------------------------------------------------------------


def test_large_file_intact_with_curl_and_requests(site, tmp_path):
    want = hashlib.sha256(BIG).hexdigest()
    out = tmp_path / "curl.bin"
    r = subprocess.run(["curl", "-sS", "--max-time", "15", "-o", str(out), "-w", "%{http_code}",
                        site.url + "/files/big.bin"], capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"200"
    assert hashlib.sha256(out.read_bytes()).hexdigest() == want
    r = get(site, "/files/big.bin")
    assert r.status_code == 200
    assert r.headers["Content-Length"] == str(len(BIG))
    assert hashlib.sha256(r.content).hexdigest() == want
    # A larger one, written after start, several times on one connection.
    data = os.urandom(5 * 1024 * 1024 + 3)
    (tmp_path / "www" / "random.bin").write_bytes(data)
    with requests.Session() as s:
        for _ in range(3):
            r = s.get(site.url + "/files/random.bin", timeout=10)
            assert hashlib.sha256(r.content).digest() == hashlib.sha256(data).digest()


def test_curl_resumes_download(site, tmp_path):
    out = tmp_path / "partial.bin"
    out.write_bytes(BIG[:300000])
    r = subprocess.run(["curl", "-sS", "--max-time", "15", "-C", "-", "-o", str(out),
                        site.url + "/files/big.bin"], capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == BIG


def test_head_on_file(site):
    s = site.connect()
    s.sendall(b"HEAD /files/big.bin HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"GET /files/hello.txt HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    s.settimeout(5)
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"\r\nContent-Length: 1048576" in head
    assert b"\r\nETag: " in head and b"\r\nLast-Modified: " in head
    # The next bytes are the GET's response, not file data.
    status, _, body, _ = read_response(Prefixed(s, rest))
    assert (status, body) == (200, b"hello file\n")
    s.close()


# --- corral serve DIR -------------------------------------------------------------------------


def test_corral_serve_dir(server_factory, tmp_path):
    root = tmp_path / "public"
    root.mkdir()
    (root / "index.html").write_text("<h1>served by corral</h1>\n")
    (root / "data.json").write_text('{"a": 1}\n')
    (root / "docs").mkdir()
    (root / "docs" / "index.html").write_text("docs\n")
    os.symlink("/etc/passwd", root / "pw")
    srv = server_factory(str(root), binary=CORRAL_BIN)
    r = get(srv, "/")
    assert r.status_code == 200
    assert r.content == b"<h1>served by corral</h1>\n"
    assert r.headers["Content-Type"].startswith("text/html")
    assert "ETag" in r.headers
    r = get(srv, "/data.json")
    assert r.status_code == 200 and r.json() == {"a": 1}
    assert r.headers["Content-Type"].startswith("application/json")
    assert get(srv, "/docs/").content == b"docs\n"
    status, headers, _ = raw_get(srv, b"/docs")
    assert status == 301 and headers["location"] == "/docs/"
    assert get(srv, "/missing.txt").status_code == 404
    for target in (b"/pw", b"/../etc/passwd", b"/%2e%2e/etc/passwd"):
        status, _, body = raw_get(srv, target)
        assert status in (400, 404), target
        assert PASSWD_MARK not in body
    r = requests.post(srv.url + "/", data=b"x", timeout=5)
    assert r.status_code == 405
    srv.wait_log(r"access remote=127\.0\.0\.1 method=GET target=/data\.json status=200")


def dotfile_root(tmp_path):
    root = tmp_path / "dotted"
    root.mkdir()
    (root / "index.html").write_text("<h1>home</h1>\n")
    (root / ".env").write_text("SECRET=hunter2\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core] secret\n")
    (root / "a").mkdir()
    (root / "a" / ".htpasswd").write_text("admin:secret\n")
    (root / "a" / "b.txt").write_text("b\n")
    (root / ".well-known").mkdir()
    (root / ".well-known" / "security.txt").write_text("Contact: mailto:sec@example.com\n")
    (root / ".well-known" / ".hidden").write_text("secret\n")
    return root


HIDDEN = [b"/.env", b"/.git/config", b"/.git/", b"/.git", b"/a/.htpasswd", b"/%2eenv",
          b"/.well-known/.hidden", b"/a/%2Ehtpasswd"]


def test_corral_serve_dir_refuses_dotfiles(server_factory, tmp_path):
    """Issue 11 #12: `corral serve DIR` answered /.env and /.git/config. A path segment starting
    with '.' is 404 by default (escaped or not); /.well-known/ is served; nothing else changes."""
    root = dotfile_root(tmp_path)
    srv = server_factory(str(root), binary=CORRAL_BIN)
    for target in HIDDEN:
        status, _, body = raw_get(srv, target)
        assert status == 404, (target, status)
        assert b"secret" not in body and b"hunter2" not in body, target
    assert get(srv, "/.well-known/security.txt").content == b"Contact: mailto:sec@example.com\n"
    assert get(srv, "/a/b.txt").content == b"b\n"
    assert get(srv, "/").content == b"<h1>home</h1>\n"


@pytest.mark.parametrize("how", ["flag", "config"])
def test_corral_serve_dir_dotfiles_opt_in(server_factory, tmp_path, how):
    root = dotfile_root(tmp_path)
    if how == "flag":
        srv = server_factory(str(root), "--serve-dotfiles", binary=CORRAL_BIN)
    else:
        srv = server_factory(binary=CORRAL_BIN, config=f'root = "{root}"\nserve_dotfiles = true\n')
    assert get(srv, "/.env").content == b"SECRET=hunter2\n"
    assert get(srv, "/.git/config").content == b"[core] secret\n"
    assert get(srv, "/a/.htpasswd").content == b"admin:secret\n"


def test_corral_check_serve_dotfiles_type(tmp_path):
    cfg = tmp_path / "corral.toml"
    cfg.write_text('serve_dotfiles = "yes"\n')
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 78
    assert "serve_dotfiles: expected true or false" in r.stdout + r.stderr, r.stdout + r.stderr
    cfg.write_text("serve_dotfiles = true\n")
    r = subprocess.run([CORRAL_BIN, "check", "--config", str(cfg)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
