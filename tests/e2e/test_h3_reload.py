"""HTTP/3 across SIGHUP reloads: no connection is lost when a new generation takes over.

During a reload the old process of slot i drains while the new one starts, and both read slot i's
UDP socket. Every server CID carries its generation's parity, and each process hands the other
generation's datagrams (and, once it drains, new connections) to it through the slot's forwarding
pair of that parity (docs/steering.md, "Reloads"). Without that, a datagram of an old connection
read by the new process gets a stateless reset, and the connection dies.

Real `corral serve --processes 4` with `[tls] listen` and `[http3] steering` forward (and bpf when
root), gtlsclient as the client:
  1. 8 downloads of a 50 MiB file running across a SIGHUP all complete with the right size;
  2. 20 concurrent clients making handshakes continuously through two SIGHUPs in a row: 0 fail;
  3. after the reloads, the new generation serves (the Corral-Process pids changed).
"""
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import free_port, poll
from h3util import GTLSCLIENT, h3_fetch, run_clients

pytestmark = pytest.mark.skipif(not os.path.exists(GTLSCLIENT), reason="gtlsclient missing")

PROCESSES = 4
BIG = 50 << 20


def steerings():
    modes = ["forward"]
    if os.geteuid() == 0:
        modes.append("bpf")
    return modes


def start(server_factory, tmp_path, steering):
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello\n")
    with open(root / "big.bin", "wb") as f:
        block = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(BIG // len(block)):
            f.write(block)
    port = free_port()
    # close_ms: an old process drains its downloads for up to this long after the reload.
    config = f"""
process_header = true
root = "{root}"
access_log = false

[timeouts]
close_ms = 60000

[tls]
listen = "127.0.0.1:{port}"

[http3]
steering = "{steering}"
retry = "off"
"""
    srv = server_factory("--processes", str(PROCESSES), binary=CORRAL_BIN, config=config)
    srv.tls_port = port
    srv.wait_log(r"http3_listening", timeout=10)
    srv.wait_log(rf"steering mode={steering}")
    return srv


def reload(srv, generation):
    """SIGHUP; waits until every slot's new process has its HTTP/3 endpoint running."""
    srv.signal(signal.SIGHUP)
    srv.wait_log(rf"reload generation={generation}", timeout=10)

    def started():
        log = srv.log()
        since = log[log.index(f"reload generation={generation}"):]
        return len(set(re.findall(r"quic_listening slot=(\d+)", since))) == PROCESSES
    poll(started, 15, f"generation {generation} to start", detail=lambda: srv.log()[-3000:])


def generation_pids(srv, generation):
    return {int(p) for p in re.findall(rf"process_started slot=\d+ pid=(\d+) cpu=-?\d+ "
                                       rf"generation={generation}\b", srv.log())}


def fetch_pids(results):
    return {int(m) for r in results for m in re.findall(r"pid=(\d+)", " ".join(r.processes))}


def forwarded_generation(srv):
    return sum(int(n) for n in re.findall(r"forwarded_generation=(\d+)", srv.log()))


def start_downloads(tmp_path, port, n, *extra):
    """n gtlsclient downloads of /big.bin; returns [(process, file, log)]."""
    clients = []
    for i in range(n):
        d = tmp_path / f"dl{i}"
        d.mkdir()
        log = open(tmp_path / f"client{i}.log", "w")
        p = subprocess.Popen(
            [GTLSCLIENT, "-q", "--exit-on-all-streams-close", "--timeout=30s", *extra,
             f"--download={d}", "127.0.0.1", str(port), f"https://localhost:{port}/big.bin"],
            stdout=log, stderr=subprocess.STDOUT)
        clients.append((p, d / "big.bin", log))
    return clients


def download_sizes(clients):
    return [f.stat().st_size if f.exists() else 0 for _, f, _ in clients]


def wait_downloads(clients, least, timeout=20):
    """Waits (at most `timeout` s, then goes on) until every download has `least` bytes; returns
    the sizes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sizes = download_sizes(clients)
        if all(s >= least for s in sizes):
            break
        time.sleep(0.02)
    return sizes


def stop_downloads(clients):
    for p, _, log in clients:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()


def check_downloads(srv, tmp_path, clients, steering):
    """Every download completed (printed with the server's forwarding count, after it stopped)."""
    sizes = download_sizes(clients)
    complete = sum(1 for s in sizes if s == BIG)
    srv.stop()  # every process logs its quic_closed line with its counters
    print(f"{steering}: {complete}/{len(clients)} downloads complete, sizes {sizes}, "
          f"forwarded_generation={forwarded_generation(srv)}")
    if complete != len(clients):
        bad = sizes.index(next(s for s in sizes if s != BIG))
        print((tmp_path / f"client{bad}.log").read_text(errors="replace")[-3000:])
    assert complete == len(clients), sizes


@pytest.mark.parametrize("steering", steerings())
def test_downloads_survive_reload(server_factory, tmp_path, steering):
    srv = start(server_factory, tmp_path, steering)
    clients = start_downloads(tmp_path, srv.tls_port, 8)
    try:
        # Reload once every download is under way (a few MiB in, far from done).
        sizes = wait_downloads(clients, 2 << 20)
        print(f"{steering}: at SIGHUP the downloads had {[s >> 20 for s in sizes]} MiB")
        assert all(s < BIG for s in sizes), "downloads too fast to span the reload"
        reload(srv, 2)
        for p, _, _ in clients:
            p.wait(timeout=120)
    finally:
        stop_downloads(clients)
    check_downloads(srv, tmp_path, clients, steering)


def continuous(port, stop, results, lock):
    while not stop.is_set():
        r = h3_fetch(port, path="/hello.txt", requests=3)
        with lock:
            results.append(r)


@pytest.mark.parametrize("steering", steerings())
def test_handshakes_through_two_reloads(server_factory, tmp_path, steering):
    srv = start(server_factory, tmp_path, steering)
    port = srv.tls_port
    old = generation_pids(srv, 1)
    stop = threading.Event()
    lock = threading.Lock()
    results = []
    threads = [threading.Thread(target=continuous, args=(port, stop, results, lock))
               for _ in range(20)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        before = len(results)
        reload(srv, 2)
        time.sleep(1.0)
        reload(srv, 3)
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    bad = [r for r in results if not r.ok]
    resets = sum(1 for r in bad if r.reset)
    print(f"{steering}: {len(results) - len(bad)}/{len(results)} connections good "
          f"({before} before the first SIGHUP), {len(bad)} failed ({resets} with a stateless "
          f"reset), forwarded_generation={forwarded_generation(srv)} (generations 1 and 2)")
    if bad:
        print("first failure output tail:\n" + bad[0].output[-3000:])
    assert before > 0
    assert not bad, f"{len(bad)} of {len(results)} connections failed across the reloads"

    # The newest generation serves: every pid is new.
    newest = generation_pids(srv, 3)
    assert len(newest) == PROCESSES
    after = run_clients(port, total=40, concurrency=20, path="/hello.txt")
    assert all(r.ok for r in after), [r for r in after if not r.ok][:1]
    pids = fetch_pids(after)
    print(f"{steering}: after the reloads pids {sorted(pids)}; generation 1 was {sorted(old)}")
    assert pids and pids <= newest, (pids, newest)
    assert not pids & old


@pytest.mark.parametrize("steering", steerings())
def test_downloads_survive_three_reloads(server_factory, tmp_path, steering):
    """Issue 11: a connection of generation 1 keeps being served while generations 2, 3 and 4
    start. With one generation bit, generation 3 shared generation 1's parity (its CIDs and its
    forwarding pair): the datagrams of generation 1's downloads it read drew stateless resets.
    Small flow-control windows keep the downloads running across the three reloads."""
    srv = start(server_factory, tmp_path, steering)
    clients = start_downloads(tmp_path, srv.tls_port, 4, "--max-data=65536",
                              "--max-stream-data-bidi-local=65536")
    try:
        wait_downloads(clients, 1 << 20)
        for generation in (2, 3, 4):
            reload(srv, generation)
        sizes = download_sizes(clients)
        print(f"{steering}: after the third reload the downloads had {[s >> 20 for s in sizes]} MiB")
        assert all(s < BIG for s in sizes), "downloads too fast to span the reloads"
        for p, _, _ in clients:
            p.wait(timeout=120)
    finally:
        stop_downloads(clients)
    check_downloads(srv, tmp_path, clients, steering)
