"""One corral per listen address (issue 11, defect 8).

Two `corral serve --listen 127.0.0.1:8080` from different directories used to both bind the
address (SO_REUSEPORT), split the traffic and run two workers for one address with two SQLite
files. Now each listen address (TCP, and QUIC's UDP port) is claimed by an abstract Unix socket
named after it (src/fanout/listen_claim.h): a second instance refuses to start, exit 75
(EX_TEMPFAIL), naming the address and the first one's pid, and the first keeps serving. A SIGHUP
reload of the first keeps its claim; once it stops, the address is free again.

Any local user can bind an abstract name: a process of another uid holding the claim's name
(listening, merely bound, or with its backlog full) used to stop corral from starting, exit 75
naming that process (issue 21). It is logged and passed over now: the claim takes a name of the
running user's own, so two corrals of that user still refuse each other.

A port some other program listens on (no claim: the bind fails) used to exit 1 with a log line;
it exits 75 as well, with a line naming the address and what to do (issue 22).
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from conftest import CORRAL_BIN, Server
from corral_test_util import ceiling, free_port, poll
from test_fanout import Fanout, get

EX_TEMPFAIL = 75


@pytest.fixture
def dirs():
    made = []

    def make():
        d = tempfile.mkdtemp(prefix="corral-lc-")  # short: Unix socket paths hold 107 bytes
        made.append(d)
        return d
    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def second(*args, cwd):
    """Another corral from another directory (its own default state dir there): it must exit."""
    r = subprocess.run([os.path.abspath(CORRAL_BIN), "serve", "--no-access-log", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=ceiling(20),
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr


def first(server_factory, state_dir, *args):
    srv = server_factory("--processes", "2", "--state-dir", state_dir, "--no-access-log", *args,
                         binary=CORRAL_BIN)
    fo = Fanout(srv, state_dir)
    fo.wait_running()
    return fo


def test_second_instance_on_the_same_address_is_refused(server_factory, dirs):
    fo = first(server_factory, dirs())
    addr = f"127.0.0.1:{fo.srv.port}"
    pids = [s["pid"] for s in fo.slots()]
    other = dirs()
    for mode in (["--processes", "2"], []):  # a supervisor; the default (the notes demo or one
        code, err = second("--listen", addr, *mode, cwd=other)  # process): each claims first
        assert code == EX_TEMPFAIL, err
        assert f"listen {addr} (tcp) is held by another corral (pid {fo.srv.proc.pid})" in err, err
    # A single server process serving a directory (no supervisor, no state dir) too.
    www = os.path.join(other, "www")
    os.mkdir(www)
    code, err = second("--listen", addr, www, cwd=other)
    assert code == EX_TEMPFAIL and f"(pid {fo.srv.proc.pid})" in err, err
    assert not os.path.exists(os.path.join(other, ".corral", "control.sock"))

    # The first one never noticed: same processes, still serving.
    assert [s["pid"] for s in fo.slots()] == pids
    assert all(get(fo.srv, "/")[0] == 200 for _ in range(8))

    # A reload keeps the claim (and works: a new generation is running).
    gen = fo.state()["generation"]
    fo.srv.signal(signal.SIGHUP)
    fo.wait_running(generation=gen + 1)
    code, err = second("--listen", addr, "--processes", "2", cwd=other)
    assert code == EX_TEMPFAIL and f"(pid {fo.srv.proc.pid})" in err, err
    assert get(fo.srv, "/")[0] == 200

    # A port 0 is claimed by the port the kernel chose.
    srv2 = server_factory("--processes", "2", "--state-dir", other, "--no-access-log",
                          binary=CORRAL_BIN)
    code, err = second("--listen", f"127.0.0.1:{srv2.port}", cwd=dirs())
    assert code == EX_TEMPFAIL and f"(pid {srv2.proc.pid})" in err, err


def test_released_address_is_taken_by_the_next_instance(server_factory, dirs):
    fo = first(server_factory, dirs())
    addr = f"127.0.0.1:{fo.srv.port}"
    fo.srv.signal(signal.SIGTERM)
    assert fo.srv.wait_exit(timeout=10) == 0
    # Same port, explicitly, from another directory: nothing is left holding it.
    d = dirs()
    proc = subprocess.Popen([CORRAL_BIN, "serve", "--processes", "2", "--listen", addr,
                             "--no-access-log", "--state-dir", d], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        for line in proc.stdout:
            if "control_listening" in line or proc.poll() is not None:
                break
        assert proc.poll() is None, proc.stdout.read()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_tls_and_quic_addresses_are_claimed(server_factory, dirs):
    fo = first(server_factory, dirs(), "--tls-listen", "127.0.0.1:0")
    m = fo.srv.wait_log(r"tls_listening address=([\d.]+:\d+)")
    tls = m.group(1)
    other = dirs()
    # Another plain address, the same TLS one: refused for the TLS address.
    code, err = second("--processes", "2", "--listen", "127.0.0.1:0", "--tls-listen", tls,
                       cwd=other)
    assert code == EX_TEMPFAIL, err
    assert f"listen {tls} (tcp) is held by another corral (pid {fo.srv.proc.pid})" in err, err
    assert get(fo.srv, "/")[0] == 200


def test_reload_onto_an_address_another_instance_holds_is_refused(server_factory, dirs):
    """A reload that adds an address claims it; held by another corral, the reload is refused
    and the old generation keeps serving."""
    other_fo = first(server_factory, dirs())
    held = f"127.0.0.1:{other_fo.srv.port}"
    d = dirs()
    cfg = os.path.join(d, "corral.toml")
    with open(cfg, "w") as f:
        f.write('listen = "127.0.0.1:0"\n')
    proc = subprocess.Popen([CORRAL_BIN, "serve", "--processes", "2", "--config", cfg,
                             "--no-access-log", "--state-dir", d], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(d, "log"), "w"), stdin=subprocess.DEVNULL)
    log = lambda: open(os.path.join(d, "log")).read()  # noqa: E731
    try:
        poll(lambda: "control_listening" in log(), 20, what="the second corral running")
        with open(cfg, "w") as f:
            f.write(f'listen = "{held}"\n')
        proc.send_signal(signal.SIGHUP)
        poll(lambda: "reload_refused" in log(), 10, what="the reload refused")
        assert (f'reload_refused problem="listen {held} (tcp) is held by another corral '
                f'(pid {other_fo.srv.proc.pid})"') in log(), log()
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert get(other_fo.srv, "/")[0] == 200


# A process of another user holding an abstract name: "listen" (it accepts nothing), "bind" (bound,
# not listening: a probe's connection is refused) or "full" (a backlog of 0 that its own
# connection fills: a probe's connection fails with EAGAIN).
SQUAT = r"""
import socket, sys
name, how = b"\0" + sys.argv[1].encode(), sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(name)
if how != "bind":
    s.listen(0)
if how == "full":
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.setblocking(False)
    c.connect(name)
print("bound", flush=True)
sys.stdin.read()
"""
NOBODY = 65534


def squat(name, how):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run a process of another uid")
    p = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          sys.executable, "-c", SQUAT, name, how], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "bound\n"
    return p


def release(p):
    p.stdin.close()
    p.wait(timeout=ceiling(10))


def serve_on(addr, *args, cwd):
    """`corral serve --listen ADDR ARGS` from `cwd`, once it listens (a conftest Server)."""
    log_path = os.path.join(cwd, "serve.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([os.path.abspath(CORRAL_BIN), "serve", "--no-access-log",
                                 "--listen", addr, *args], cwd=cwd, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL)
    srv = Server(proc, "127.0.0.1", int(addr.rsplit(":", 1)[1]), log_path)
    poll(lambda: "listening address=" in srv.log() or proc.poll() is not None, ceiling(20),
         what="corral listening", detail=srv.log)
    if proc.poll() is not None:
        raise AssertionError(f"corral exited with {proc.returncode}:\n{srv.log()}")
    return srv


def test_a_claim_held_by_another_user_does_not_stop_corral(dirs):
    addr = f"127.0.0.1:{free_port()}"
    here = dirs()
    www = os.path.join(here, "www")
    os.mkdir(www)
    with open(os.path.join(www, "index.html"), "w") as f:
        f.write("<p>here</p>\n")
    # One process serving a directory: it claims the address before it binds it.
    for how in ("listen", "bind", "full"):
        other = squat(f"corral-listen-tcp-{addr}", how)
        srv = None
        try:
            srv = serve_on(addr, www, cwd=here)
            assert get(srv, "/")[0] == 200
            pid = other.pid if how == "listen" else "unknown"  # only a listener takes the probe
            srv.wait_log(rf"warn listen_claim_foreign claim=tcp-{re.escape(addr)} "
                         rf"holder_uid={NOBODY} holder_pid={pid} exclusive=yes",
                         timeout=ceiling(5))
        finally:
            if srv:
                srv.stop()
            release(other)
        assert srv.proc.returncode == 0, srv.log()

    # A supervisor too; and the claim still does its job: it was taken under this user's own
    # name, so a second corral of this user on the address is refused, naming the first.
    other = squat(f"corral-listen-tcp-{addr}", "listen")
    srv = None
    try:
        state = dirs()
        srv = serve_on(addr, "--processes", "2", "--state-dir", state, cwd=state)
        fo = Fanout(srv, state)
        fo.wait_running(timeout=ceiling(10))
        assert get(srv, "/")[0] == 200
        srv.wait_log(r"listen_claim_foreign .*exclusive=yes", timeout=ceiling(5))
        code, err = second("--listen", addr, "--processes", "2", cwd=dirs())
        assert code == EX_TEMPFAIL and f"(pid {srv.proc.pid})" in err, err
        assert get(srv, "/")[0] == 200
    finally:
        if srv:
            srv.stop()
        release(other)


def test_an_address_another_program_listens_on_exits_75(dirs):
    """Not a corral: a plain listening socket (no claim, no SO_REUSEPORT) holds the port. Every
    mode exits 75 (EX_TEMPFAIL, as docs/config.md lists) with one line naming the address and what
    to do, and leaves nothing behind."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    addr = f"127.0.0.1:{holder.getsockname()[1]}"
    try:
        here = dirs()
        www = os.path.join(here, "www")
        os.mkdir(www)
        # one process serving a directory; a supervisor; the default (the notes demo's kind)
        for mode in ([www], ["--processes", "2"], []):
            code, err = second("--listen", addr, *mode, cwd=here)
            assert code == EX_TEMPFAIL, (mode, code, err)
            assert f"bind {addr}: Address already in use: another program listens there" in err, \
                (mode, err)
            assert "listen elsewhere (--listen" in err, (mode, err)
        # The TLS address too.
        code, err = second("--listen", "127.0.0.1:0", "--tls-listen", addr, "--processes", "2",
                           cwd=here)
        assert code == EX_TEMPFAIL, (code, err)
        assert f"bind {addr}: Address already in use" in err, err
        assert not os.path.exists(os.path.join(here, ".corral", "control.sock"))
    finally:
        holder.close()
