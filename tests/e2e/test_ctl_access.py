"""Who may use the control socket (docs/operate.md, "The control socket"): only the user running
corral. The socket is 0600 in a 0700 state directory, and a peer of another uid is refused at
accept by SO_PEERCRED (logged `control_refused uid=...`, closed unanswered) even when the file's
mode was opened. The second local user is `nobody` (the test runs as root, like CI)."""
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling, control_request, wait_control_socket

PYTHON = "/usr/bin/python3"  # one that nobody may run (not under /root)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (to run a client as nobody) and setpriv")

# Connects to the socket as whoever runs it and prints what came back (or the error).
CLIENT = """import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(20)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(3)
data = b""
try:  # closed at accept: the send may already find the socket closed
    s.sendall(b"GET /processes HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n")
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except (BrokenPipeError, ConnectionResetError):
    pass
print("answer:", data[:40])
"""


def as_nobody(*cmd):
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           *cmd], capture_output=True, text=True, timeout=ceiling(20))


@pytest.fixture
def base():
    # Under /tmp, not in pytest's 0700 tmp_path: nobody must reach the directory to be refused
    # by the socket itself.
    d = tempfile.mkdtemp(prefix="corral-ctl-access-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_another_user_is_refused_even_with_the_socket_opened(server_factory, base):
    state = os.path.join(base, "state")
    srv = server_factory("--state-dir", state, "--processes", "2", binary=CORRAL_BIN)
    wait_control_socket(state, ceiling(10), what="control socket", detail=srv.log)
    sock = os.path.join(state, "control.sock")
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    nobody = pwd.getpwnam("nobody").pw_uid

    # The modes alone stop nobody, at the directory.
    r = as_nobody(PYTHON, "-c", CLIENT, sock)
    assert r.returncode == 3 and "Permission denied" in r.stdout, r.stdout + r.stderr
    r = as_nobody(CORRAL_BIN, "ctl", "processes", "--state-dir", state)
    assert r.returncode == 77 and r.stdout == "", r.stdout + r.stderr

    # Opened: nobody reaches the socket, and is closed unanswered.
    os.chmod(state, 0o755)
    os.chmod(sock, 0o666)
    r = as_nobody(PYTHON, "-c", CLIENT, sock)
    assert r.returncode == 0 and r.stdout.strip() == "answer: b''", r.stdout + r.stderr
    srv.wait_log(rf"control_refused uid={nobody} pid=\d+", timeout=ceiling(5))
    # The user running corral is served as before.
    status, body = control_request(state, "GET", "/processes")
    assert status == 200 and b'"processes"' in body
    assert "control_refused uid=0" not in srv.log()
