"""The fan-out (`corral serve --processes N`): the supervisor, its server processes and the kernel's
SO_REUSEPORT group, driven from outside with real load (wrk), real signals and real crashes.

What is checked (docs/process-model.md describes the model):
  * kill -9 of a server process every second under load: no connection refused or left hanging;
    the only failures are the killed process's own connections; the slot comes back with the same
    index and CPU;
  * SIGHUP 20 times under load: not one failed request; a broken file is refused and logged;
  * SIGTERM finishes a running request, then everything exits 0; a second SIGTERM kills;
  * SIGKILL of the supervisor takes every server process with it (PR_SET_PDEATHSIG);
  * a crash loop at startup backs off, shows in `corral ctl processes`, and stops nothing else;
  * a process that exits 0 is not respawned;
  * --processes limits and --processes 0.

Server process PIDs come from the supervisor's state (`corral ctl processes`, or the same JSON
from its control socket), never from `ps`. Everything waits for events (state, log, exit) with a
deadline; the only fixed pauses are the test's own schedule (a kill every second, a SIGHUP every
0.5 s) and the 0.5 s window in which a respawn that must not happen would have happened.
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_get, ctl, http_get, poll, read_until_close

EX_CONFIG = 78
ALLOWED_CPUS = sorted(os.sched_getaffinity(0))
WRK_CONNECTIONS = 32


# --- helpers ------------------------------------------------------------------------------------


class Fanout:
    """A running `corral serve --processes N` with its state directory."""

    def __init__(self, srv, state_dir):
        self.srv = srv
        self.state_dir = state_dir

    def ctl(self):
        """The supervisor's state as `corral ctl processes` prints it, or None if it did not answer."""
        r = ctl(self.state_dir, "processes", "--json", timeout=5)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def state(self):
        """The same JSON straight from the control socket (what `corral ctl processes` asks)."""
        return control_get(self.state_dir, "/processes")

    def slots(self):
        st = self.state()
        return st["processes"] if st else None

    def wait_running(self, timeout=10.0, generation=None):
        """Waits until every slot has a running process (of `generation`, if given)."""
        def ok():
            st = self.state()
            if not st or not st["processes"]:
                return None
            if generation is not None and st["generation"] != generation:
                return None
            for s in st["processes"]:
                if s["status"] != "running" or s["pid"] <= 0:
                    return None
                if generation is not None and s["generation"] != generation:
                    return None
            return st
        return poll(ok, timeout, what="every slot running", detail=self.detail)

    def detail(self):
        return f"state: {self.state()}\nlog (tail):\n{self.log()[-3000:]}"

    def log(self):
        return self.srv.log()


@pytest.fixture
def state_dir():
    # Short on purpose: a Unix socket path holds at most 107 bytes, pytest's tmp_path can be long.
    d = tempfile.mkdtemp(prefix="corral-fo-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fanout(server_factory, state_dir):
    """Starts `corral serve --processes N ...` and waits until every slot is running."""
    def start(*args, env=None, config=None, wait_running=True):
        srv = server_factory(*args, "--state-dir", state_dir, "--no-access-log",
                             binary=CORRAL_BIN, env=env, config=config)
        fo = Fanout(srv, state_dir)
        if wait_running:
            fo.wait_running()
        return fo
    return start


def cpus_allowed(pid):
    """The CPUs a process may run on, from /proc/PID/status (Cpus_allowed_list: "0-1,3")."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                out = set()
                for part in line.split(":", 1)[1].strip().split(","):
                    lo, _, hi = part.partition("-")
                    out.update(range(int(lo), int(hi or lo) + 1))
                return out
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def process_gone(pid):
    """True once `pid` no longer runs (gone, or a zombie waiting for its new parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


class Wrk:
    """wrk in the background; result() parses its summary. Its timeout is 5 s instead of the
    default 2 s: a connection that waits in a dead slot's queue is served once the slot's new
    process accepts (~10-30 ms idle), but CI machines run other jobs beside this one; a
    connection that is never served still counts as a timeout."""

    def __init__(self, url, seconds, connections=WRK_CONNECTIONS, threads=2):
        self.seconds = seconds
        self.proc = subprocess.Popen(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s",
             "--latency", url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.started = time.monotonic()

    def result(self):
        out, _ = self.proc.communicate(timeout=self.seconds + 20)
        assert self.proc.returncode == 0, out
        m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
        assert m, out
        r = {"requests": int(m.group(1)), "connect": 0, "read": 0, "write": 0, "timeout": 0,
             "non2xx": 0, "output": out}
        m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
        if m:
            r.update(connect=int(m.group(1)), read=int(m.group(2)), write=int(m.group(3)),
                     timeout=int(m.group(4)))
        m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        if m:
            r["non2xx"] = int(m.group(1))
        m = re.search(r"Requests/sec:\s+([\d.]+)", out)
        r["rps"] = float(m.group(1)) if m else 0.0
        m = re.search(r"99%\s+([\d.]+\w+)", out)
        r["p99"] = m.group(1) if m else "?"
        m = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out)
        r["max"] = m.group(1) if m else "?"
        return r

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def wrk_runs():
    runs = []

    def start(url, seconds):
        w = Wrk(url, seconds)
        runs.append(w)
        return w
    yield start
    for w in runs:
        w.kill()


def get(srv, path="/hello", timeout=3.0):
    """One request on a fresh connection; returns (status, body)."""
    return http_get(srv.host, srv.port, path, timeout)


def signal_deaths(log):
    """process_exited lines of processes that died of a signal the test did not send."""
    return [l for l in log.splitlines()
            if "process_exited" in l and re.search(r'how="signal (?!9")\d+"', l)]


def need_cpus(n):
    if len(ALLOWED_CPUS) < n:
        pytest.skip(f"needs {n} CPUs, this process may use {len(ALLOWED_CPUS)}")


# --- crashes under load -------------------------------------------------------------------------


def test_kill9_every_second_under_load(fanout, wrk_runs):
    """kill -9 one server process every second for 20 s under wrk: nothing refused, nothing left
    hanging, failures bounded by the killed processes' own connections; each slot comes back
    with its index and its CPU."""
    need_cpus(2)
    fo = fanout("--processes", "2", "--pin")
    first = fo.wait_running()["processes"]
    cpu_of = {s["index"]: s["cpu"] for s in first}
    assert cpu_of == {0: ALLOWED_CPUS[0], 1: ALLOWED_CPUS[1]}
    for s in first:
        assert cpus_allowed(s["pid"]) == {s["cpu"]}

    kills, respawn_ms = 20, []
    running_since = {0: time.monotonic(), 1: time.monotonic()}
    wrk = wrk_runs(fo.srv.url + "/hello", 22)
    for k in range(kills):
        # The schedule: one kill per second, alternating slots, so each process runs ~2 s: more
        # than the 1 s after which a death is a crash, not a crash loop (no backoff). On a slow
        # machine the schedule slips rather than kill a process younger than that.
        slot = k % 2
        time.sleep(max(0.0, wrk.started + 1.0 + k - time.monotonic(),
                       running_since[slot] + 1.05 - time.monotonic()))
        victim = next(s for s in fo.slots() if s["index"] == slot)
        assert victim["status"] == "running", victim
        t0 = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)

        def replaced():
            s = next(s for s in (fo.slots() or []) if s["index"] == slot)
            return s if s["status"] == "running" and s["pid"] not in (0, victim["pid"]) else None
        new = poll(replaced, 5.0, what=f"slot {slot} respawned after kill {k + 1}",
                   detail=fo.detail)
        running_since[slot] = time.monotonic()
        respawn_ms.append((running_since[slot] - t0) * 1000)
        assert new["cpu"] == cpu_of[slot]
        assert new["last_exit"] == "signal 9"
        assert cpus_allowed(new["pid"]) == {cpu_of[slot]}
    r = wrk.result()

    failed = r["read"] + r["write"]
    print(f"\nkill test: {kills} kills, {r['requests']} requests ({r['rps']:.0f}/s), "
          f"errors connect={r['connect']} read={r['read']} write={r['write']} "
          f"timeout={r['timeout']} non2xx={r['non2xx']}, {failed / kills:.1f} failed per kill; "
          f"latency p99={r['p99']} max={r['max']}; respawn seen running after "
          f"median {sorted(respawn_ms)[len(respawn_ms) // 2]:.0f} ms, max {max(respawn_ms):.0f} ms")
    assert r["requests"] > 0
    assert r["connect"] == 0, r["output"]  # a dead slot's socket stays open: nothing refused
    assert r["timeout"] == 0, r["output"]  # and its queue is served by the replacement
    assert r["non2xx"] == 0, r["output"]
    assert failed <= WRK_CONNECTIONS * kills, r["output"]

    final = {s["index"]: s for s in fo.slots()}
    assert final[0]["restarts"] == kills // 2 and final[1]["restarts"] == kills // 2, final
    assert all(s["backoff_ms"] == 0 for s in final.values()), final
    assert "process_backoff" not in fo.log()
    assert signal_deaths(fo.log()) == []
    assert fo.srv.proc.poll() is None


def test_respawn_keeps_slot_and_cpu(fanout):
    need_cpus(2)
    fo = fanout("--processes", "2", "--pin")
    before = {s["index"]: s for s in fo.wait_running()["processes"]}
    os.kill(before[1]["pid"], signal.SIGKILL)

    def replaced():
        s = {s["index"]: s for s in (fo.slots() or [])}.get(1)
        return s if s and s["status"] == "running" and s["pid"] != before[1]["pid"] else None
    after = poll(replaced, 5.0, what="slot 1 respawned", detail=fo.detail)
    assert (after["index"], after["cpu"], after["restarts"], after["last_exit"]) == (
        1, ALLOWED_CPUS[1], 1, "signal 9")
    assert cpus_allowed(after["pid"]) == {ALLOWED_CPUS[1]}
    fo.srv.wait_log(rf"process_started slot=1 pid={after['pid']} cpu={ALLOWED_CPUS[1]} ")
    # `corral ctl processes` prints the same state.
    printed = fo.ctl()["processes"]
    assert [(s["index"], s["pid"], s["cpu"], s["status"]) for s in printed] == [
        (0, before[0]["pid"], ALLOWED_CPUS[0], "running"), (1, after["pid"], ALLOWED_CPUS[1], "running")]
    # The other slot was not touched.
    assert next(s for s in fo.slots() if s["index"] == 0)["pid"] == before[0]["pid"]
    assert get(fo.srv) == (200, b"hello")


# --- reload -------------------------------------------------------------------------------------


def test_sighup_20_times_under_load_loses_nothing(fanout, wrk_runs):
    fo = fanout("--processes", "2", config='log_level = "info"\n')
    gen = fo.wait_running()["generation"]
    hups, ready_ms = 20, []
    wrk = wrk_runs(fo.srv.url + "/hello", 12)
    for k in range(hups):
        time.sleep(max(0.0, wrk.started + 0.75 + 0.5 * k - time.monotonic()))
        t0 = time.monotonic()
        fo.srv.signal(signal.SIGHUP)
        gen += 1
        fo.wait_running(timeout=5.0, generation=gen)
        ready_ms.append((time.monotonic() - t0) * 1000)
    r = wrk.result()
    # Every old process drains and exits (2 per reload), with status 0 (checked below).
    poll(lambda: len(re.findall(r"process_exited ", fo.log())) >= 2 * hups, 10.0,
         what="every old generation to exit", detail=fo.detail)
    print(f"\nSIGHUP test: {hups} reloads, {r['requests']} requests ({r['rps']:.0f}/s), "
          f"errors connect={r['connect']} read={r['read']} write={r['write']} "
          f"timeout={r['timeout']} non2xx={r['non2xx']}; latency p99={r['p99']} max={r['max']}; "
          f"new generation running after median {sorted(ready_ms)[len(ready_ms) // 2]:.0f} ms, "
          f"max {max(ready_ms):.0f} ms")
    deaths = signal_deaths(fo.log())
    assert deaths == [], "server processes died during reloads:\n" + "\n".join(deaths)
    assert len(re.findall(r'process_exited .*how="exit 0"', fo.log())) == 2 * hups
    assert r["requests"] > 0
    assert (r["connect"], r["read"], r["write"], r["timeout"], r["non2xx"]) == (0, 0, 0, 0, 0), \
        r["output"]
    assert fo.state()["generation"] == gen
    assert fo.srv.proc.poll() is None


def test_sighup_with_broken_config_keeps_serving(fanout):
    fo = fanout("--processes", "2", config='log_level = "info"\n')
    before = fo.wait_running()
    path = fo.srv.proc.args[fo.srv.proc.args.index("--config") + 1]
    with open(path, "w") as f:
        f.write('log_level = "loud"\nprocesses = "two"\n')
    fo.srv.signal(signal.SIGHUP)
    fo.srv.wait_log(r"error reload_refused .*log_level")
    after = fo.state()
    assert after["generation"] == before["generation"]
    assert [s["pid"] for s in after["processes"]] == [s["pid"] for s in before["processes"]]
    assert all(s["status"] == "running" for s in after["processes"])
    for _ in range(4):
        assert get(fo.srv) == (200, b"hello")
    assert fo.srv.proc.poll() is None


# --- stopping -----------------------------------------------------------------------------------


def start_stream(srv):
    s = socket.create_connection((srv.host, srv.port), timeout=5)
    s.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
    buf = b""
    while b"tick 0" not in buf:  # the head and the first tick: the request is running
        b = s.recv(65536)
        assert b, buf
        buf += b
    return s, buf


def test_sigterm_finishes_running_request_then_exits_0(fanout):
    fo = fanout("--processes", "2")
    pids = [s["pid"] for s in fo.wait_running()["processes"]]
    sock, buf = start_stream(fo.srv)
    t0 = time.monotonic()
    fo.srv.signal(signal.SIGTERM)
    rest, how = read_until_close(sock, timeout=5)
    sock.close()
    data = buf + rest
    assert how == "eof"
    assert data.startswith(b"HTTP/1.1 200 ")
    body = data.partition(b"\r\n\r\n")[2]
    for i in range(10):
        assert f"tick {i}\n".encode() in body, body
    assert body.endswith(b"0\r\n\r\n"), body  # the chunked body's end: the response is complete
    assert fo.srv.wait_exit(timeout=5) == 0
    elapsed = time.monotonic() - t0
    print(f"\nSIGTERM with a running /stream: supervisor exited 0 after {elapsed * 1000:.0f} ms")
    assert elapsed < 3.0
    assert all(process_gone(p) for p in pids)
    log = fo.log()
    assert "terminate processes=2" in log
    assert len(re.findall(r'process_exited .*how="exit 0"', log)) == 2
    assert "supervisor_stopped" in log
    assert "SIGKILL" not in log


def test_second_sigterm_kills_at_once(fanout):
    fo = fanout("--processes", "2")
    pids = [s["pid"] for s in fo.wait_running()["processes"]]
    sock, buf = start_stream(fo.srv)
    fo.srv.signal(signal.SIGTERM)
    fo.srv.wait_log(r"info terminate processes=2")
    fo.srv.signal(signal.SIGTERM)
    assert fo.srv.wait_exit(timeout=3) == 0
    rest, how = read_until_close(sock, timeout=3)
    assert how != "timeout", rest
    sock.close()
    # The stream was cut (SIGKILL), not finished: no chunked terminator, not all ten ticks.
    assert not (buf + rest).endswith(b"0\r\n\r\n") and b"tick 9" not in buf + rest
    assert "terminate_forced" in fo.log()
    assert all(process_gone(p) for p in pids)


def test_sigkill_on_supervisor_takes_every_process(fanout):
    fo = fanout("--processes", "2")
    pids = [s["pid"] for s in fo.wait_running()["processes"]]
    t0 = time.monotonic()
    fo.srv.proc.kill()
    fo.srv.proc.wait(timeout=5)
    poll(lambda: all(process_gone(p) for p in pids), 1.0, interval=0.01,
         what=f"server processes {pids} to die with their supervisor")
    print(f"\nSIGKILL on the supervisor: children gone after {(time.monotonic() - t0) * 1000:.0f} ms")


def test_child_exiting_0_is_not_respawned(fanout):
    """A server process that exits 0 by itself (here: someone sends it SIGTERM; it drains and
    exits 0) is not respawned; when every process has exited 0 the supervisor stops, with status 1:
    nothing asked it to (test_supervisor_stays.py)."""
    fo = fanout("--processes", "2")
    pids = {s["index"]: s["pid"] for s in fo.wait_running()["processes"]}
    os.kill(pids[1], signal.SIGTERM)

    def exited():
        s = {s["index"]: s for s in (fo.slots() or [])}.get(1)
        return s if s and s["status"] == "exited" else None
    s1 = poll(exited, 5.0, what="slot 1 exited", detail=fo.detail)
    assert (s1["pid"], s1["last_exit"], s1["restarts"]) == (0, "exit 0", 0)
    # A respawn would come at once (the process ran > 1 s) or after 100 ms (backoff): a window of
    # 0.5 s shows there is none.
    time.sleep(0.5)
    s1 = next(s for s in fo.slots() if s["index"] == 1)
    assert (s1["status"], s1["pid"]) == ("exited", 0)
    assert len(re.findall(r"process_started slot=1 ", fo.log())) == 1
    assert next(s for s in fo.slots() if s["index"] == 0)["pid"] == pids[0]
    os.kill(pids[0], signal.SIGTERM)
    assert fo.srv.wait_exit(timeout=5) == 1


# --- crash loop ---------------------------------------------------------------------------------


def test_crash_at_start_backs_off_and_shows_in_state(fanout, no_core_dumps):
    fo = fanout("--processes", "2", env={"CORRAL_TEST_CRASH_AT_START": "1"}, wait_running=False)
    seen, ctl_ms, slot0_pid = [], [], None
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        st = fo.state()
        ctl_ms.append((time.monotonic() - t0) * 1000)
        if not st:
            time.sleep(0.02)
            continue
        s0, s1 = st["processes"]
        if s0["status"] == "running":
            slot0_pid = slot0_pid or s0["pid"]
            assert s0["pid"] == slot0_pid and s0["restarts"] == 0, s0
        if s1["status"] == "backoff" and (s1["restarts"], s1["backoff_ms"]) not in seen:
            assert s1["pid"] == 0 and s1["last_exit"] == "signal 6", s1
            seen.append((s1["restarts"], s1["backoff_ms"]))
        if s1["backoff_ms"] >= 1600 and slot0_pid:
            break
        time.sleep(0.02)
    print(f"\ncrash loop: (restarts, backoff_ms) seen {seen}; ctl answered in at most "
          f"{max(ctl_ms):.0f} ms")
    assert slot0_pid, "slot 0 never ran"
    assert len(seen) >= 3 and seen[-1][1] >= 1600, seen
    for (r0, b0), (r1, b1) in zip(seen, seen[1:]):
        assert r1 > r0 and b1 == min(b0 * 2 ** (r1 - r0), 30_000), seen
    assert seen[0][1] == 100 * 2 ** (seen[0][0] - 1), seen  # 100 ms after the first crash
    assert max(ctl_ms) < 1000  # the supervisor answers while it backs off
    fo.srv.wait_log(r"warn process_backoff slot=1 backoff_ms=800 ")
    # What an operator sees.
    s1 = fo.ctl()["processes"][1]
    assert s1["status"] in ("backoff", "starting") and s1["restarts"] >= seen[-1][0], s1
    assert s1["last_exit"] == "signal 6"

    # Slot 0 serves. Connections the kernel hashes to slot 1's socket wait in its queue (the
    # documented limitation), so open several at once: some land on slot 0 and are answered.
    socks = []
    for _ in range(16):
        s = socket.create_connection((fo.srv.host, fo.srv.port), timeout=2)
        s.sendall(b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        s.setblocking(False)
        socks.append(s)
    replies = {s: b"" for s in socks}
    done = set()

    def some_answered():
        ready, _, _ = select.select([s for s in socks if s not in done], [], [], 0.05)
        for s in ready:
            b = s.recv(65536)
            replies[s] += b
            if not b:
                done.add(s)
        return [s for s in done if replies[s].startswith(b"HTTP/1.1 200 ")
                and replies[s].endswith(b"hello")]
    poll(some_answered, 2.0, interval=0, what="an answer from slot 0")
    settle = time.monotonic() + 0.2  # the others hashed to slot 0 finish meanwhile (a count)
    while time.monotonic() < settle and len(done) < len(socks):
        some_answered()
    answered = len(some_answered())
    for s in socks:
        s.close()
    print(f"crash loop: {answered} of 16 connections answered by slot 0")
    assert answered >= 1

    t0 = time.monotonic()
    fo.srv.signal(signal.SIGTERM)
    assert fo.srv.wait_exit(timeout=3) == 0
    assert time.monotonic() - t0 < 2.0  # not a backoff's wait, nor close_ms
    assert process_gone(slot0_pid)


# --- limits -------------------------------------------------------------------------------------


def test_processes_over_64_refused(server_factory, state_dir):
    srv = server_factory("--processes", "65", "--state-dir", state_dir, binary=CORRAL_BIN,
                         wait=False)
    assert srv.wait_exit(timeout=10) == EX_CONFIG
    assert "processes: 65 is more than the maximum of 64" in srv.log()


def test_pin_more_processes_than_cpus_refused(server_factory, state_dir):
    n = len(ALLOWED_CPUS) + 1
    if n > 64:
        pytest.skip("more than 63 CPUs")
    srv = server_factory("--processes", str(n), "--pin", "--state-dir", state_dir,
                         binary=CORRAL_BIN, wait=False)
    assert srv.wait_exit(timeout=10) == EX_CONFIG
    log = srv.log()
    assert re.search(rf"pin: .*only {len(ALLOWED_CPUS)} CPUs are allowed", log), log
    assert "process_started" not in log


def test_processes_0_is_one_per_cpu(fanout):
    fo = fanout("--processes", "0")
    fo.srv.wait_log(rf"listening address=\S+ processes={len(ALLOWED_CPUS)} pin=false")
    slots = fo.wait_running()["processes"]
    assert [s["index"] for s in slots] == list(range(len(ALLOWED_CPUS)))
    assert len({s["pid"] for s in slots}) == len(ALLOWED_CPUS)
    assert all(s["cpu"] == -1 for s in slots)  # not pinned without --pin
    assert get(fo.srv) == (200, b"hello")
