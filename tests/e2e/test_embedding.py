"""The embedding API (src/app/app.h): examples/rooms is an application built on the C++ API that
hosts a worker kind next to its own site and runs the same supervisor `corral serve` runs. Its
site authenticates a bearer token to a principal; the kind `room` (/room/{name}/*) runs its worker
in-process (a function of the example, run in the forked child by worker_main) and admits only
the room's members (its authorize hook); its start hook gives the worker the member list.

What is checked, on the real binary with real clients (curl, http.client):
  * the application's own route answers, with the principal its authenticator found;
  * a member reaches the worker: 200 with what the worker answers (the room, the principal the
    proxy passed on, the members from the start hook), and the control API shows the worker
    running as a child of the supervisor;
  * a principal that is not a member, an anonymous request and an unknown token are refused (403,
    code "forbidden") before anything forks: no entry for the address in the manager's state, no
    `worker_starting` for it in the log;
  * an authorize hook that throws refuses (403) and the log has `authorize_failed`;
  * SIGTERM stops the server processes and the workers: the supervisor exits 0, the worker's
    process is gone, nothing is logged as failed.
Every wait polls an observable with a deadline.
"""
import http.client
import json
import os
import signal
import socket
import subprocess

import pytest

from conftest import poll
from corral_test_util import alive

ROOMS_BIN = os.environ.get("CORRAL_ROOMS", "build/debug/examples/rooms/example_rooms")


@pytest.fixture
def rooms(server_factory, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    srv = server_factory("--state-dir", str(state), binary=ROOMS_BIN)
    srv.state_dir = str(state)
    poll(lambda: os.path.exists(os.path.join(srv.state_dir, "control.sock")), 10,
         what="control socket", detail=srv.log)
    return srv


def request(srv, path, token=None):
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=15)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def workers_state(srv):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(os.path.join(srv.state_dir, "control.sock"))
        s.sendall(b"GET /workers HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data
    return json.loads(body)


def ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except FileNotFoundError:
        return None


def assert_nothing_forked(srv, address):
    assert address not in workers_state(srv), workers_state(srv)
    assert f'worker_starting address="{address}"' not in srv.log(), srv.log()


def test_the_applications_own_route(rooms):
    out = subprocess.run(["curl", "-sS", "-H", "Authorization: Bearer alice-token",
                          f"{rooms.url}/"], capture_output=True, text=True, timeout=15)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "rooms, for alice\n"
    assert request(rooms, "/") == (200, b"rooms\n")


def test_a_member_reaches_the_room_worker(rooms):
    out = subprocess.run(["curl", "-sS", "-w", "\\n%{http_code}", "-H",
                          "Authorization: Bearer bob-token", f"{rooms.url}/room/kitchen/"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    body, _, code = out.stdout.rpartition("\n")
    assert code == "200", (out.stdout, rooms.log())
    assert json.loads(body) == {"room": "kitchen", "principal": "bob",
                                "members": ["alice", "bob"]}
    entry = workers_state(rooms)["room:kitchen"]
    assert entry["status"] == "running", entry
    # In-process: the worker is a forked copy of the example itself, a child of the supervisor.
    assert ppid(entry["pid"]) == rooms.proc.pid
    status, body = request(rooms, "/room/kitchen/", "alice-token")
    assert status == 200 and json.loads(body)["principal"] == "alice"
    assert workers_state(rooms)["room:kitchen"]["pid"] == entry["pid"]  # the same worker


def test_a_stranger_is_refused_before_anything_forks(rooms):
    status, _ = request(rooms, "/room/attic/", "bob-token")  # attic: alice only
    assert status == 403
    assert_nothing_forked(rooms, "room:attic")
    # The member still gets in afterwards.
    status, body = request(rooms, "/room/attic/", "alice-token")
    assert status == 200, (body, rooms.log())
    assert json.loads(body)["members"] == ["alice"]


@pytest.mark.parametrize("token", [None, "no-such-token"])
def test_anonymous_is_refused(rooms, token):
    status, body = request(rooms, "/room/kitchen/", token)
    # The authenticator makes no token and an unknown one anonymous; the hook refuses anonymous.
    assert status == 403, body
    assert json.loads(body)["error"]["code"] == "forbidden"
    assert_nothing_forked(rooms, "room:kitchen")


def test_a_throwing_authorize_hook_refuses_and_is_logged(rooms):
    status, _ = request(rooms, "/room/kitchen/", "boom-token")
    assert status == 403
    rooms.wait_log(r'authorize_failed .*address="room:kitchen"')
    assert_nothing_forked(rooms, "room:kitchen")


def test_sigterm_stops_the_processes_and_the_workers(rooms):
    status, _ = request(rooms, "/room/kitchen/", "alice-token")
    assert status == 200
    pid = workers_state(rooms)["room:kitchen"]["pid"]
    rooms.signal(signal.SIGTERM)
    assert rooms.wait_exit(timeout=20) == 0, rooms.log()
    # Gone, not re-parented: a worker that outlived the supervisor would have a new parent by now.
    try:
        poll(lambda: not alive(pid), 5, what="the worker gone")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        raise
    log = rooms.log()
    assert "supervisor_stopped" in log
    assert "worker_failed" not in log and " error " not in log
    assert not os.path.exists(os.path.join(rooms.state_dir, "control.sock"))
