"""The state directory is the running user's alone (issue 11, defect 7).

A local user who pre-creates `.corral/tls/` with her own dev key used to have root's
`corral serve --tls-listen …` serve her certificate, and she kept owning the directory. Now the
state directory and what corral reads from it (tls/ with the dev key and certificate; with
workers sockets/, locks/, logs/) must be owned by the running user and not group/other writable
(checked with lstat: a link counts only if it is ours), or corral refuses to start naming the
path, exit 77 (EX_NOPERM). Missing directories are made 0700.

The tests that hand a path to another user need root (chown); the mode tests do not.
"""
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

from conftest import CORRAL_BIN
from corral_test_util import ceiling

EX_NOPERM = 77
OTHER_UID = 65534  # nobody (a uid needs no passwd entry to own a file)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def base():
    d = tempfile.mkdtemp(prefix="corral-sd-")  # short: Unix socket paths hold 107 bytes
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def serve_tls(state_dir, *extra, timeout=20):
    """`corral serve --tls-listen` on free ports; returns (exit status or None, output, proc)."""
    proc = subprocess.Popen(
        [CORRAL_BIN, "serve", "--listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0",
         "--no-http3", "--no-access-log", "--state-dir", state_dir, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    return proc


def refused(state_dir, *extra):
    proc = serve_tls(state_dir, *extra)
    try:
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def serves(state_dir):
    """corral starts with TLS on `state_dir` (its log says tls_listening, then control_listening:
    the supervisor handles SIGTERM from there), then stops with 0."""
    proc = serve_tls(state_dir)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "control_listening" in line:
                break
        assert any("tls_listening" in l for l in lines), "".join(lines)
        assert any("control_listening" in l for l in lines), "".join(lines)
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return "".join(lines)


def test_missing_state_dir_is_made_0700_and_serves(base):
    sd = os.path.join(base, "state")
    log = serves(sd)
    assert "dev=true" in log
    for d in (sd, os.path.join(sd, "tls")):
        st = os.lstat(d)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
        assert st.st_uid == os.geteuid()
    key = os.lstat(os.path.join(sd, "tls", "dev-key.pem"))
    assert stat.S_IMODE(key.st_mode) == 0o600 and key.st_uid == os.geteuid()
    serves(sd)  # and again, on what it made


@needs_root
def test_tls_dir_of_another_user_is_refused(base):
    """Her .corral/tls/ with her own dev key and certificate: not adopted, not served."""
    sd = os.path.join(base, "state")
    os.mkdir(sd, 0o700)
    subprocess.run([CORRAL_BIN, "cert", "--dir", os.path.join(sd, "tls")], check=True,
                   capture_output=True)
    tls = os.path.join(sd, "tls")
    for p in (tls, os.path.join(tls, "dev-key.pem"), os.path.join(tls, "dev-cert.pem")):
        os.chown(p, OTHER_UID, OTHER_UID)
    before = {n: os.stat(os.path.join(tls, n)).st_mtime_ns for n in os.listdir(tls)}
    code, out = refused(sd)
    assert code == EX_NOPERM, out
    assert f"{tls}: owned by uid {OTHER_UID}" in out, out
    assert "tls_listening" not in out and "process_started" not in out
    # Still hers, untouched.
    assert os.stat(tls).st_uid == OTHER_UID
    assert {n: os.stat(os.path.join(tls, n)).st_mtime_ns for n in os.listdir(tls)} == before


@needs_root
def test_state_dir_of_another_user_is_refused(base):
    sd = os.path.join(base, "state")
    os.mkdir(sd, 0o700)
    os.chown(sd, OTHER_UID, OTHER_UID)
    code, out = refused(sd)
    assert code == EX_NOPERM, out
    assert f"state directory {sd}: owned by uid {OTHER_UID}" in out, out
    assert os.listdir(sd) == []  # nothing made in it
    # `corral cert` and `corral ctl` refuse it the same way.
    for cmd in (["cert", "--state-dir", sd], ["ctl", "processes", "--state-dir", sd]):
        r = subprocess.run([CORRAL_BIN, *cmd], capture_output=True, text=True,
                           timeout=ceiling(10))
        assert r.returncode == EX_NOPERM and sd in r.stderr, (cmd, r.stderr)


@needs_root
def test_dev_key_of_another_user_in_our_dir_is_refused(base):
    sd = os.path.join(base, "state")
    tls = os.path.join(sd, "tls")
    os.makedirs(tls, 0o700)
    subprocess.run([CORRAL_BIN, "cert", "--dir", tls], check=True, capture_output=True)
    key = os.path.join(tls, "dev-key.pem")
    os.chown(key, OTHER_UID, OTHER_UID)
    code, out = refused(sd)
    assert code == EX_NOPERM and f"{key}: owned by uid {OTHER_UID}" in out, out


@needs_root
def test_link_of_another_user_is_refused(base):
    """A symbolic link is followed only when it is ours: hers, to our own directory, is not."""
    target = os.path.join(base, "ours")
    os.mkdir(target, 0o700)
    link = os.path.join(base, "state")
    os.symlink(target, link)
    os.lchown(link, OTHER_UID, OTHER_UID)
    code, out = refused(link)
    assert code == EX_NOPERM and f"{link}: a symbolic link owned by uid {OTHER_UID}" in out, out
    os.unlink(link)
    os.symlink(target, link)  # ours: followed, and the directory behind it is checked
    serves(link)


@pytest.mark.parametrize("mode,who", [(0o777, "others"), (0o770, "its group"),
                                      (0o1777, "others")], ids=["0777", "0770", "1777"])
def test_group_or_world_writable_dirs_are_refused(base, mode, who):
    sd = os.path.join(base, "state")
    os.mkdir(sd)
    os.chmod(sd, mode)
    code, out = refused(sd)
    assert code == EX_NOPERM, out
    assert f"state directory {sd}: writable by {who} (mode {mode:04o}" in out, out
    # The same for tls/ in a good state directory; nothing is chmod-ed into shape.
    os.chmod(sd, 0o700)
    tls = os.path.join(sd, "tls")
    os.mkdir(tls)
    os.chmod(tls, mode)
    code, out = refused(sd)
    assert code == EX_NOPERM and f"{tls}: writable by {who}" in out, out
    assert stat.S_IMODE(os.stat(tls).st_mode) == mode


def test_a_file_where_the_state_dir_should_be_is_refused(base):
    sd = os.path.join(base, "state")
    with open(sd, "w") as f:
        f.write("not a directory\n")
    code, out = refused(sd)
    assert code == EX_NOPERM and f"{sd}: not a directory" in out, out


@needs_root
def test_workers_dirs_of_another_user_are_refused(base):
    """With workers, sockets/, locks/ and logs/ are checked before the supervisor starts."""
    for sub in ("sockets", "locks", "logs"):
        sd = os.path.join(base, sub + "-case")
        os.makedirs(os.path.join(sd, sub), 0o700)
        os.chmod(sd, 0o700)
        os.chown(os.path.join(sd, sub), OTHER_UID, OTHER_UID)
        cfg = os.path.join(base, "corral.toml")
        with open(cfg, "w") as f:
            f.write('[workers.w]\ncommand = ["/bin/true"]\nroutes = ["/w/{id}/*"]\n')
        r = subprocess.run([CORRAL_BIN, "serve", "--listen", "127.0.0.1:0", "--config", cfg,
                            "--state-dir", sd], capture_output=True, text=True,
                           timeout=ceiling(20))
        assert r.returncode == EX_NOPERM, (sub, r.stderr)
        assert f"{os.path.join(sd, sub)}: owned by uid {OTHER_UID}" in r.stderr, r.stderr
