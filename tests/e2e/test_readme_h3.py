"""The README's HTTP/3 command, run as written (the port and the download directory replaced by the
test's) against `corral serve --tls-listen`: it must print the response body and exit on its own.
A bare `gtlsclient HOST PORT URL` prints the QUIC trace and a hex dump on stderr and then waits
for its 30 s idle timeout; the README's line makes it quiet, write the body to a file, exit when
the request's stream closes, and print the file.
"""
import os
import re
import subprocess

import pytest

from conftest import CORRAL_BIN
from h3util import GTLSCLIENT

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")

pytestmark = pytest.mark.skipif(not os.path.exists(GTLSCLIENT), reason="gtlsclient missing")


def readme_h3_command():
    with open(README) as f:
        lines = [ln.strip() for ln in f if ln.lstrip().startswith("gtlsclient ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_readme_h3_command_prints_the_body_and_exits(server_factory, tmp_path):
    command = readme_h3_command()
    assert "127.0.0.1 8443 https://localhost:8443/hello" in command and "/tmp" in command, command
    srv = server_factory("--tls-listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                         binary=CORRAL_BIN)
    port = srv.wait_log(r"http3_listening address=[\d.]+:(\d+)", timeout=10).group(1)
    srv.wait_log(r"quic_listening slot=0", timeout=10)
    downloads = tmp_path / "dl"
    downloads.mkdir()
    command = re.sub(r"\b8443\b", port, command).replace("/tmp", str(downloads))
    # 20 s: below gtlsclient's own 30 s idle timeout, which a command that does not exit by itself
    # waits for.
    r = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert r.stdout == "hello", (r.stdout, r.stderr[-2000:])
    assert r.stderr == ""
