"""Helpers shared by the Python tests (tests/e2e, tests/quic, tests/worker): one copy of each.

Raw HTTP/1.1 reads on a socket (a response, a head, a pipelined sequence), reading until the peer
closes and checking that it does, polling for a condition with a deadline, the supervisor's control
socket and `corral ctl`, /proc lookups (alive, RSS), a free TCP+UDP port, and ceiling() for the
bound of a wait. Plain functions with no pytest fixtures, so tests outside tests/e2e import this
file by a sys.path insert; conftest.py keeps the fixtures that start servers. Every wait takes its
bound from the caller (each test keeps its own timeout); none sleeps where it can read an event.
"""
import json
import os
import socket
import subprocess
import time

CORRAL_BIN = os.environ.get("CORRAL_BIN", "build/debug/corral")

# --- bounds of waits ----------------------------------------------------------------------------

# The tests run on sanitized builds (CORRAL_SANITIZED=1, set by tests/CMakeLists.txt for the
# asan-ubsan preset) on machines as small and busy as 2 shared cores: there a bare `corral --help`
# once took over 10 s. A ceiling is a bound that a healthy run never comes near, so scaling it
# costs nothing when things work; CORRAL_TIME_SCALE overrides the factor.
SANITIZED = os.environ.get("CORRAL_SANITIZED") == "1"
TIME_SCALE = float(os.environ.get("CORRAL_TIME_SCALE") or (4 if SANITIZED else 1))


def ceiling(seconds):
    """The bound of a wait (a subprocess, an exit, a log line) of `seconds` on a plain build,
    scaled for sanitized builds. Not for bounds a test asserts as a property ("answers within
    0.5 s"): those say what they measure."""
    return seconds * TIME_SCALE


# --- polling ------------------------------------------------------------------------------------


def poll(fn, timeout, what="condition", detail=None, interval=0.02):
    """Calls fn() until it returns something truthy; returns it. Fails after `timeout` seconds,
    with detail() (the state, the log) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f"\n{detail()}" if detail else ""))
        time.sleep(interval)


# --- raw HTTP/1.1 reads -------------------------------------------------------------------------


class Prefixed:
    """A socket whose next reads return `prefix` first: lets read_response continue after the
    leftover bytes of the previous response (pipelining). `prefix` may be refilled between reads."""

    def __init__(self, sock, prefix=b""):
        self.sock, self.prefix = sock, prefix

    def settimeout(self, t):
        self.sock.settimeout(t)

    def recv(self, n, *flags):
        if self.prefix:
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            return out
        return self.sock.recv(n, *flags)


def parse_head(head):
    """(status line, headers dict with lowercased names) of a head without its blank line."""
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return lines[0], headers


def read_head(sock, buf=b"", timeout=5.0):
    """Reads one response head (no body), after the bytes `buf` already read; returns
    (status line, headers dict, leftover)."""
    sock.settimeout(timeout)
    while b"\r\n\r\n" not in buf:
        b = sock.recv(65536)
        if not b:
            raise ConnectionError(f"closed before a full head: {buf!r}")
        buf += b
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, headers = parse_head(head)
    return status_line, headers, rest


def read_response(sock, timeout=5.0):
    """Reads one HTTP/1.1 response with Content-Length or chunked framing.
    Returns (status, headers dict lowercased, body bytes, leftover bytes)."""
    status_line, headers, rest = read_head(sock, timeout=timeout)
    status = int(status_line.split(" ")[1])
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            b = sock.recv(65536)
            if not b:
                raise ConnectionError("closed inside a body")
            rest += b
        return status, headers, rest[:n], rest[n:]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += sock.recv(65536)
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            while len(rest) < size + 2:
                rest += sock.recv(65536)
            body += rest[:size]
            rest = rest[size + 2:]
            if size == 0:
                return status, headers, body, rest
    return status, headers, b"", rest


def read_responses(sock, count, timeout=5.0):
    """Reads `count` responses in a row from `sock`; returns [(status, headers, body)], leftover."""
    out = []
    left = b""
    for _ in range(count):
        status, headers, body, left = read_response(Prefixed(sock, left), timeout=timeout)
        out.append((status, headers, body))
    return out, left


def send_refusable(sock, data, bytewise=False):
    """Sends `data` whole or one byte per send(); a server that refuses and closes before the end
    is no error here (its answer is read next)."""
    try:
        if not bytewise:
            sock.sendall(data)
            return
        for i in range(len(data)):
            sock.send(data[i:i + 1])
    except (BrokenPipeError, ConnectionResetError):
        pass


def exchange(srv, request, timeout=5.0):
    """Sends the raw `request` on a new connection of `srv` (a conftest Server), reads one
    response; returns (status, headers, body)."""
    with srv.connect(timeout=timeout) as s:
        s.sendall(request)
        status, headers, body, _ = read_response(s, timeout)
    return status, headers, body


# --- reading until the peer closes --------------------------------------------------------------


def read_until_close(sock, timeout=5.0):
    """Reads until the peer closes or `timeout` passes with nothing to read; returns
    (bytes, how): how is "eof" (a FIN), "reset" (an RST) or "timeout" (still open)."""
    sock.settimeout(timeout)
    chunks = []
    try:
        while True:
            b = sock.recv(65536)
            if not b:
                return b"".join(chunks), "eof"
            chunks.append(b)
    except ConnectionResetError:
        return b"".join(chunks), "reset"
    except socket.timeout:
        return b"".join(chunks), "timeout"


def recv_all(sock, timeout=5.0):
    """Reads until the peer closes (or timeout); returns the bytes."""
    return read_until_close(sock, timeout)[0]


def read_to_eof(sock, timeout=5.0, reset_ok=True):
    """Reads until the server closes; raises socket.timeout if it does not within `timeout`, and
    ConnectionResetError on a reset unless `reset_ok`."""
    data, how = read_until_close(sock, timeout)
    if how == "timeout":
        raise socket.timeout(f"still open after {timeout}s; read {data[:200]!r}")
    if how == "reset" and not reset_ok:
        raise ConnectionResetError(f"reset after {data[:200]!r}")
    return data


def expect_closed(sock, timeout=3.0):
    """The server closes the connection (EOF or reset) within `timeout`; returns what it sent
    before (callers that expect nothing more assert it is empty)."""
    data, how = read_until_close(sock, timeout)
    if how == "timeout":
        raise AssertionError(f"connection still open after {timeout}s; extra bytes {data[:200]!r}")
    return data


def http_get(host, port, path="/hello", timeout=3.0):
    """One GET on a fresh connection with `Connection: close`; returns (status, body)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        data = read_to_eof(s, timeout, reset_ok=False)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


# --- the supervisor's control socket and `corral ctl` -------------------------------------------


def control_request(state_dir, method, path, timeout=5):
    """One request on the supervisor's control socket; returns (status, body). Raises OSError
    when nothing answers there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(os.path.join(state_dir, "control.sock"))
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                  f"Connection: close\r\n\r\n".encode())
        data = read_to_eof(s, timeout, reset_ok=False)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def control_get(state_dir, path, timeout=5):
    """GET `path` on the control socket: the JSON body, or None if it did not answer 200. Polling
    loops use this rather than `corral ctl`, as starting a process per poll costs 10 ms idle and up
    to seconds on a loaded CI machine."""
    try:
        status, body = control_request(state_dir, "GET", path, timeout)
    except (OSError, ValueError, IndexError):
        return None
    return json.loads(body) if status == 200 else None


def wait_control_socket(state_dir, timeout, **kw):
    """Waits until the supervisor's control socket exists in `state_dir`."""
    poll(lambda: os.path.exists(os.path.join(state_dir, "control.sock")), timeout, **kw)


def ctl(state_dir, *args, timeout=None):
    """Runs `corral ctl ARGS --state-dir STATE_DIR`; returns the CompletedProcess (text). Its
    bound is `timeout` seconds as given, or ceiling(10) by default."""
    return subprocess.run([CORRAL_BIN, "ctl", *args, "--state-dir", state_dir],
                          capture_output=True, text=True,
                          timeout=ceiling(10) if timeout is None else timeout)


def ctl_json(state_dir, *args, timeout=None):
    """`corral ctl ARGS --json`'s JSON output; fails (with what it printed) when it exits non-zero.
    (Without --json every verb prints a table or a line for a person.)"""
    r = ctl(state_dir, *args, "--json", timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


# --- processes ----------------------------------------------------------------------------------


def proc_stat(pid):
    """(state letter, parent pid) of `pid` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    return rest[0], int(rest[1])


def alive(pid):
    """`pid` runs (it is neither gone nor a zombie)."""
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def children_of(ppid):
    """{pid: cmdline bytes} of the live (not zombie) children of `ppid`, from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = proc_stat(int(d))
        if st is None or st[1] != ppid or st[0] == "Z":
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                out[int(d)] = f.read()
        except OSError:
            continue
    return out


def rss_kib(pid, missing=None):
    """The resident set of `pid` in KiB (VmRSS); `missing` when it has none (a zombie), or an
    AssertionError if `missing` is None."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    if missing is None:
        raise AssertionError(f"no VmRSS for {pid}")
    return missing


def free_port():
    """A port free for both TCP and UDP on 127.0.0.1."""
    for _ in range(50):
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            u.close()
            t.close()
    raise RuntimeError("no free TCP+UDP port")
