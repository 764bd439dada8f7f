"""The process's life: graceful shutdown on SIGTERM, readiness before routes are published,
reloading the admission policy on SIGHUP, and the `corral` command line (check, serve, --help,
--version) with its exit codes."""
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

from conftest import CORRAL_BIN, CORRAL_TESTSITE
from corral_test_util import Prefixed, ceiling, read_head, read_response, read_to_eof


EX_CONFIG = 78


def read_chunked(sock, buf, timeout=5.0):
    """Decodes a chunked body whose first bytes are `buf`; returns (body, leftover)."""
    sock.settimeout(timeout)
    body = b""

    def more():
        b = sock.recv(65536)
        if not b:
            raise ConnectionError(f"closed inside a chunked body after {body!r}")
        return b

    while True:
        while b"\r\n" not in buf:
            buf += more()
        size_line, _, buf = buf.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(buf) < size + 2:
            buf += more()
        body += buf[:size]
        buf = buf[size + 2:]
        if size == 0:
            return body, buf


def request(srv, target=b"/hello", host=b"localhost", sock=None):
    s = sock or srv.connect()
    s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    status, headers, body, _ = read_response(s)
    if sock is None:
        s.close()
    return status, headers, body


def count(srv, pattern):
    return len(re.findall(pattern, srv.log()))


# --- graceful shutdown ------------------------------------------------------------------------

SLOW_CASES = {
    "testsite": (None, b"/slow?ms=1500", b"slow done\n"),
    "corral": (CORRAL_BIN, b"/stream", b"".join(f"tick {i}\n".encode() for i in range(10))),
}


@pytest.mark.parametrize("case", sorted(SLOW_CASES))
def test_sigterm_finishes_running_request_and_closes_idle(server_factory, case):
    binary, target, want = SLOW_CASES[case]
    # A linger far longer than the exit bound below: a process that lingered after its last
    # connection closed fails wait_exit rather than a clock comparison.
    srv = server_factory(binary=binary, config="[timeouts]\nlinger_ms = 120000\n")
    idle = srv.connect()
    assert request(srv, sock=idle)[0] == 200  # now an idle keep-alive connection
    busy = srv.connect()
    busy.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status_line, headers, rest = read_head(busy)  # the stream's head: the request is running
    assert status_line == "HTTP/1.1 200 OK"
    assert headers["transfer-encoding"] == "chunked"

    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    assert read_to_eof(idle, timeout=ceiling(3)) == b""
    idle_closed = time.monotonic() - t0
    assert idle_closed < 0.5, f"idle connection closed after {idle_closed:.2f}s"
    # The listener is gone too.
    with pytest.raises(OSError):
        socket.create_connection((srv.host, srv.port), timeout=2).close()

    body, left = read_chunked(busy, rest, timeout=ceiling(5))
    assert body == want
    assert left == b""
    assert read_to_eof(busy, timeout=ceiling(3)) == b""  # then the server closes it
    assert time.monotonic() - t0 >= 0.7  # the running request was not cut short
    busy.close()  # ends the server's linger on that connection: nothing is left to wait for
    # Not lingering for 120 s: the process exits once its last connection is gone.
    assert srv.wait_exit(timeout=ceiling(10)) == 0
    srv.wait_log(r"info shutdown .*connections=2", timeout=ceiling(5))
    srv.wait_log(r"info stopped requests=2", timeout=ceiling(5))
    idle.close()
    busy.close()


def test_sigterm_close_timeout_cuts_long_request(server_factory):
    srv = server_factory(config="[timeouts]\nclose_ms = 300\n")
    busy = srv.connect()
    busy.sendall(b"GET /slow?ms=20000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    read_head(busy)
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    read_to_eof(busy, timeout=ceiling(5))
    elapsed = time.monotonic() - t0
    assert 0.2 <= elapsed < 3, elapsed
    assert srv.wait_exit(timeout=ceiling(5)) == 0
    srv.wait_log(r"close_timeout connections=1", timeout=ceiling(5))
    busy.close()


def test_sigterm_when_idle_exits_at_once(server_factory):
    srv = server_factory(binary=CORRAL_BIN)
    assert request(srv)[0] == 200
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(timeout=ceiling(5)) == 0
    assert time.monotonic() - t0 < 2
    assert "stopped requests=1" in srv.log()


# --- readiness --------------------------------------------------------------------------------


def test_request_waits_for_publish(server_factory):
    srv = server_factory("--publish-delay-ms", "800")
    t0 = time.monotonic()
    s = srv.connect()
    s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n"
              b"GET /users/5 HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, _, body, left = read_response(s, timeout=ceiling(5))
    waited = time.monotonic() - t0
    assert (status, body) == (200, b"hello")
    assert waited >= 0.4, f"answered after {waited:.2f}s, before the site was published"
    status, _, body, _ = read_response(Prefixed(s, left))
    assert (status, body) == (200, b'{"id":"5"}')
    s.close()
    r = requests.get(srv.url + "/hello", timeout=ceiling(5))
    assert r.status_code == 200


def test_ready_timeout_503(server_factory):
    srv = server_factory("--publish-delay-ms", "3000", config="[timeouts]\nready_ms = 300\n")
    t0 = time.monotonic()
    s = srv.connect()
    s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\n\r\n")
    status, headers, _, _ = read_response(s, timeout=ceiling(5))
    waited = time.monotonic() - t0
    assert status == 503
    assert headers.get("connection") == "close"
    assert 0.2 <= waited < 2.5, waited
    srv.wait_log(r"request_refused .*status=503", timeout=ceiling(5))
    s.close()


# --- SIGHUP: admission policy reload ----------------------------------------------------------


@pytest.mark.parametrize("binary", [CORRAL_TESTSITE, CORRAL_BIN], ids=["testsite", "corral"])
def test_sighup_reloads_allowed_hosts(server_factory, tmp_path, binary):
    srv = server_factory(binary=binary, config='allowed_hosts = ["example.test"]\n')
    cfg = tmp_path / "corral.toml"
    assert cfg.read_text() == 'allowed_hosts = ["example.test"]\n'

    admitted = srv.connect()
    assert request(srv, host=b"example.test", sock=admitted)[0] == 200
    local = srv.connect()
    assert request(srv, host=b"localhost", sock=local)[0] == 200
    assert request(srv, host=b"other.test")[0] == 403

    cfg.write_text('allowed_hosts = ["other.test"]\n')
    srv.signal(signal.SIGHUP)
    srv.wait_log(r"info reloaded", timeout=ceiling(5))
    # The idle connection admitted under the removed host is closed by the server...
    assert read_to_eof(admitted, timeout=ceiling(3)) == b""
    srv.wait_log(r'connection_revoked remote=127\.0\.0\.1 host="example\.test"',
                 timeout=ceiling(5))
    # ...one admitted under a loopback name is not.
    status, _, body = request(srv, host=b"localhost", sock=local)
    assert (status, body) == (200, b"hello")
    assert request(srv, host=b"example.test")[0] == 403
    assert request(srv, host=b"other.test")[0] == 200
    assert request(srv, host=b"OTHER.test:8080")[0] == 200

    # A broken file is refused and the last good policy stays.
    cfg.write_text('allowed_hosts = "not-a-list"\n')
    srv.signal(signal.SIGHUP)
    srv.wait_log(r"reload_refused .*allowed_hosts", timeout=ceiling(5))
    assert count(srv, r"info reloaded") == 1
    assert request(srv, host=b"other.test")[0] == 200
    assert request(srv, host=b"example.test")[0] == 403
    assert request(srv, host=b"localhost", sock=local)[0] == 200
    assert srv.proc.poll() is None
    admitted.close()
    local.close()


def test_sighup_revoked_host_finishes_running_request_then_closes(server_factory, tmp_path):
    srv = server_factory(config='allowed_hosts = ["example.test"]\n')
    busy = srv.connect()
    busy.sendall(b"GET /slow?ms=800 HTTP/1.1\r\nHost: example.test\r\n\r\n")
    status_line, _, rest = read_head(busy)
    assert status_line == "HTTP/1.1 200 OK"
    (tmp_path / "corral.toml").write_text("allowed_hosts = []\n")
    srv.signal(signal.SIGHUP)
    srv.wait_log(r"info reloaded", timeout=ceiling(5))
    body, left = read_chunked(busy, rest)
    assert body == b"slow done\n"  # the response under way is not cut
    assert read_to_eof(busy, timeout=ceiling(3)) == left == b""  # then the connection is closed
    srv.wait_log(r'connection_revoked .*host="example\.test"', timeout=ceiling(5))
    assert request(srv, host=b"example.test")[0] == 403


# --- the corral command line ------------------------------------------------------------------


def corral(*args, timeout=15):
    """Runs `corral ARGS` to its exit; `timeout` (seconds on a plain build) is scaled for sanitized
    builds, where a bare `--help` took over 10 s on a busy 2-core machine."""
    return subprocess.run([CORRAL_BIN, *args], capture_output=True, text=True,
                          timeout=ceiling(timeout), stdin=subprocess.DEVNULL)


BAD_CONFIG = """\
listen = "nonsense"
colour = "blue"
access_log = "yes"
log_level = "loud"
allowed_hosts = ["http://example.test/"]
relays = ["10.1.0.0/8"]

[limits]
max_headers = 0
max_body = "big"
surprise = 1

[timeouts]
header_ms = 0
keepalive_ms = "long"
"""

BAD_KEYS = ["listen", "colour", "access_log", "log_level", "allowed_hosts[0]", "relays[0]",
            "limits.max_headers", "limits.max_body", "limits.surprise", "timeouts.header_ms",
            "timeouts.keepalive_ms"]


def test_check_reports_every_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_CONFIG)
    r = corral("check", "--config", str(bad))
    assert r.returncode == EX_CONFIG, (r.stdout, r.stderr)
    assert "ok" not in r.stdout
    lines = r.stderr.strip().splitlines()
    for key in BAD_KEYS:
        hits = [ln for ln in lines if re.search(rf"(^|: ){re.escape(key)}: \S", ln)]
        assert hits, f"no problem reported for {key}:\n{r.stderr}"
    text = r.stderr
    assert re.search(r"colour: unknown key", text)
    assert re.search(r"limits\.surprise: unknown key", text)
    assert re.search(r"access_log: \"yes\" would be a file name: write true or false", text)
    assert re.search(r"limits\.max_headers: 0 is out of range", text)
    assert re.search(r"timeouts\.header_ms: 0 is out of range", text)
    assert re.search(r"limits\.max_body: expected an integer", text)
    assert str(bad) in text


def test_check_says_what_a_route_or_a_key_lacks(tmp_path):
    """A route without its leading "/" is told so (not that it lacks a {param}); an unknown key
    close to a known one at its level gets "did you mean"; one close to none gets nothing more."""
    cfg = tmp_path / "typos.toml"
    cfg.write_text(f"""\
listn = "127.0.0.1:8080"
Log_Level = "warn"
colour = "blue"

[limits]
max_bdy = 1

[workers.doc]
command = ["{sys.executable}"]
routes = ["doc/{{id}}/*", "/plain/*"]
idel = "30s"
""")
    r = corral("check", "--config", str(cfg))
    assert r.returncode == EX_CONFIG, (r.stdout, r.stderr)
    err = r.stderr
    assert "workers.doc.routes: 'doc/{id}/*' must start with / (\"/doc/{id}/*\")" in err, err
    assert "'doc/{id}/*' must be a path with at least one {param}" not in err, err
    assert "'/plain/*' must be a path with at least one {param}" in err, err
    assert 'listn: unknown key; did you mean "listen"?' in err, err
    assert 'Log_Level: unknown key; did you mean "log_level"?' in err, err
    assert 'limits.max_bdy: unknown key; did you mean "max_body"?' in err, err
    assert 'workers.doc.idel: unknown key; did you mean "idle"?' in err, err
    assert re.search(r"colour: unknown key$", err, re.M), err


def test_check_syntax_error_names_line(tmp_path):
    bad = tmp_path / "syntax.toml"
    bad.write_text('listen = "127.0.0.1:8080"\nroot = \n')
    r = corral("check", "--config", str(bad))
    assert r.returncode == EX_CONFIG
    assert re.search(r":2:\d+", r.stderr), r.stderr


def test_check_missing_file(tmp_path):
    r = corral("check", "--config", str(tmp_path / "absent.toml"))
    assert r.returncode == EX_CONFIG
    assert "absent.toml" in r.stderr


def test_check_good_config(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("""\
listen = "127.0.0.1:8080"
log_level = "warn"
access_log = false
allowed_hosts = ["example.test", "[::1]"]
relays = ["10.0.0.0/8", "::1"]
server_name = "x"

[limits]
max_headers = 50
max_body = 1048576

[timeouts]
header_ms = 5000
ready_ms = 300
close_ms = 0
""")
    r = corral("check", "--config", str(good))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
    assert r.stderr == ""


def test_serve_with_bad_config_exits_78(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_CONFIG)
    r = corral("serve", "--listen", "127.0.0.1:0", "--config", str(bad))
    assert r.returncode == EX_CONFIG
    assert "colour: unknown key" in r.stderr
    assert "listening" not in r.stderr


def test_version_and_help():
    r = corral("--version")
    assert r.returncode == 0
    assert re.fullmatch(r"corral \d+\.\d+\.\d+\s*", r.stdout), r.stdout
    r = corral("--help")
    assert r.returncode == 0
    assert "serve" in r.stdout and "check" in r.stdout
    r = corral("serve", "--help")
    assert r.returncode == 0
    assert "--listen" in r.stdout and "--config" in r.stdout


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1", "127.0.0.1:99999", "999.1.1.1:80",
                                    ":"])
def test_serve_bad_listen_exits_78(listen):
    r = corral("serve", "--listen", listen)
    assert r.returncode == EX_CONFIG, (listen, r.stderr)
    # One short line that names the setting (e.g. "listen: invalid port 'nonsense'").
    assert re.search(r"\blisten\b.*: ", r.stderr), r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3
    assert "listening" not in r.stderr


def test_serve_bad_dir_and_log_level(tmp_path):
    r = corral("serve", str(tmp_path / "absent"), "--listen", "127.0.0.1:0")
    assert r.returncode == EX_CONFIG
    assert "is not a directory" in r.stderr
    r = corral("serve", "--listen", "127.0.0.1:0", "--log-level", "chatty")
    assert r.returncode == EX_CONFIG
    assert "--log-level" in r.stderr


def test_no_subcommand_is_usage_error():
    r = corral()
    assert r.returncode not in (0, EX_CONFIG)
    assert "subcommand" in r.stderr


def test_serve_no_access_log(server_factory):
    srv = server_factory("--no-access-log", binary=CORRAL_BIN)
    assert request(srv)[0] == 200
    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(timeout=ceiling(5)) == 0
    assert "access remote=" not in srv.log()
    assert "stopped requests=1" in srv.log()


def test_check_reads_the_tls_files(tmp_path):
    """corral check names a missing certificate file and a key that does not match it."""
    import subprocess as sp
    for name in ("a", "b"):
        sp.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / f"{name}.key"),
                "-out", str(tmp_path / f"{name}.pem"), "-days", "2", "-subj", "/CN=localhost"],
               check=True, stdout=sp.DEVNULL, stderr=sp.DEVNULL)
    cfg = tmp_path / "tls.toml"

    def check(cert, key):
        cfg.write_text(f'[tls]\nlisten = "127.0.0.1:8443"\ncert = "{cert}"\nkey = "{key}"\n')
        return corral("check", "--config", str(cfg))

    r = check(tmp_path / "a.pem", tmp_path / "a.key")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    r = check(tmp_path / "absent.pem", tmp_path / "a.key")
    assert r.returncode == EX_CONFIG and "absent.pem" in r.stderr, r.stderr
    r = check(tmp_path / "a.pem", tmp_path / "b.key")
    assert r.returncode == EX_CONFIG and "tls.key" in r.stderr and "b.key" in r.stderr, r.stderr
