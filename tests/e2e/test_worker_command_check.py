"""`corral check` and `corral serve` refuse a worker command that cannot run (issue 11, defect 12):
the program is resolved as the launcher's execvpe resolves it (a bare name through PATH, a path
with a '/' from the working directory, which workers inherit), and a missing, non-executable or
directory program is "workers.<kind>.command: '<path>' …", exit status 78 (EX_CONFIG), for both.
"""
import os
import subprocess

from conftest import CORRAL_BIN

EX_CONFIG = 78


def run(*args, cwd=None, env=None):
    return subprocess.run([CORRAL_BIN, *args], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL, cwd=cwd, env={**os.environ, **(env or {})})


def config(tmp_path, program, name="w.toml"):
    path = tmp_path / name
    path.write_text(f'[workers.doc]\ncommand = ["{program}", "--flag"]\n'
                    'routes = ["/doc/{id}/*"]\n')
    return str(path)


def refused(r, message):
    assert r.returncode == EX_CONFIG, (r.returncode, r.stdout, r.stderr)
    assert f"workers.doc.command: {message}" in r.stderr, r.stderr
    assert "ok" not in r.stdout


def test_check_refuses_what_cannot_be_executed(tmp_path):
    missing = tmp_path / "no-such-worker"
    refused(run("check", "--config", config(tmp_path, missing)), f"'{missing}' does not exist")
    plain = tmp_path / "plain.py"
    plain.write_text("print('not executable')\n")
    plain.chmod(0o644)
    refused(run("check", "--config", config(tmp_path, plain)), f"'{plain}' is not executable")
    refused(run("check", "--config", config(tmp_path, tmp_path)), f"'{tmp_path}' is a directory")
    # a bare name: searched in PATH, as exec searches it
    r = run("check", "--config", config(tmp_path, "corral-no-such-program"),
            env={"PATH": f"{tmp_path}:/usr/bin"})
    refused(r, f"'corral-no-such-program' is not an executable file in PATH ({tmp_path}:/usr/bin)")
    # ... and a name that is in PATH only as a non-executable file is refused too
    r = run("check", "--config", config(tmp_path, "plain.py"), env={"PATH": str(tmp_path)})
    refused(r, "'plain.py' is not an executable file in PATH")


def test_check_accepts_what_exec_finds(tmp_path):
    tool = tmp_path / "bin" / "my-worker"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    for program, cwd, env in ((tool, None, None),                                # absolute
                              ("my-worker", None, {"PATH": f"/nonexistent:{tool.parent}"}),
                              ("sh", None, None),                                # /bin or /usr/bin
                              ("./bin/my-worker", str(tmp_path), None)):         # from the cwd
        r = run("check", "--config", config(tmp_path, program), cwd=cwd, env=env)
        assert r.returncode == 0, (program, r.stderr)
        assert r.stdout.strip().endswith(": ok"), r.stdout
    # a relative path is the working directory's, not the config file's
    r = run("check", "--config", config(tmp_path, "./bin/my-worker"), cwd=str(tool.parent))
    refused(r, "'./bin/my-worker' does not exist")


def test_serve_refuses_it_with_the_same_message(tmp_path):
    missing = tmp_path / "no-such-worker"
    r = run("serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
            "--config", config(tmp_path, missing))
    refused(r, f"'{missing}' does not exist")
    assert "listening" not in r.stderr + r.stdout
