"""Rollout (issue 13, docs/deploying.md): new code of a worker kind reaches every live worker, in
place or by replacement, with no request lost. Driven from outside on the real binary
(`corral serve` with `[workers.<kind>] code = "..."`) and the example workers, C++
(examples/worker_cpp) and Python (examples/worker_python, here through tests/e2e/rollout_worker.py,
which adds test hooks around the example's reload hook), whose `GET /code` answers
{"version": <the version it runs>, "hello": <its hello.txt>, "pid": N}.

What is checked (the acceptance list of issue 13):
  * under load (threads with keep-alive connections on 50 addresses of each language), 20
    rollouts alternating two versions, in place (here) and by replacement
    (test_rollout_replacement.py, its own ctest entry: 2,000 worker starts): no failed request,
    and no response from code older than the version whose rollout had completed before the
    request was sent (each response names its version; every one is checked against the rollouts'
    start and end times);
  * a reload that throws (a `reload-fails` file): listed with its error, exit status 1, the old
    version still served, the kind dirty; the next good rollout applies and clears it;
  * during one rollout: a reload that crashes (the hook aborts) and a worker killed with -9 in its
    reload are listed with an error and their addresses failed; a worker stopped (`ctl stop`)
    during its reload is listed `stopped`; a worker starting when the rollout began reloads
    after its `ready` and ends on the new version; a worker started during the rollout is not in
    the report and runs the new version; the next rollout clears the failed addresses, and a
    request starts each on the new version;
  * a reload whose caller gave up (reload_timeout) still has its late reply handled;
  * `--watch`: a file written in a code directory reaches 100 live workers (the time from the
    write to the last one on the new version is printed; only correctness is asserted);
  * rollback with `--to` (full version and a prefix) restores the earlier version everywhere;
  * the snapshot store under <state>/code: the version is the SHA-256 of the contract's lines,
    two versions sharing a file store it once (one inode), a version is removed once it is
    neither kept nor run, and 50 rollouts leave only the kept versions and their objects;
  * errors of `ctl rollout`: unknown kind, a kind without code, an unknown version.

Every wait polls an observable (the control API, the events file rollout_worker.py writes, the
log) with a deadline. Times are from time.monotonic() in this process: a request's send time is
taken before it is written, its receive time after its response is read, a rollout's start
before `corral ctl rollout` is spawned and its end after it has exited.
"""
import concurrent.futures
import hashlib
import http.client
import json
import os
import random
import signal
import sys
import threading
import time

import pytest

from conftest import CORRAL_BIN
from corral_test_util import control_request, ctl, poll, wait_control_socket

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PY_WORKER = os.path.join(HERE, "rollout_worker.py")
CPP_WORKER = os.environ.get(
    "CORRAL_EXAMPLE_WORKER",
    os.path.join(os.path.dirname(os.path.abspath(CORRAL_BIN)), "examples", "worker_cpp",
                 "example_worker"))
PYTHON = sys.executable or "/usr/bin/python3"
SANITIZED = os.environ.get("CORRAL_SANITIZED") == "1"


def have_cpp():
    return os.access(CPP_WORKER, os.X_OK)


def need_cpp():
    if not have_cpp():
        pytest.skip(f"{CPP_WORKER} is not built")


def toml_str(s):
    return json.dumps(s)


# --- the version of a set, as ROLLOUT.md / docs/deploying.md define it ---------------------------


def digest(data):
    return hashlib.sha256(data).hexdigest()


def version_of(files):
    """The version of {relative path: bytes}: SHA-256 of "<path>\\0<digest>\\n", bytewise order."""
    lines = b"".join(p.encode() + b"\0" + digest(files[p]).encode() + b"\n"
                     for p in sorted(files, key=lambda p: p.encode()))
    return digest(lines)


def same_version(full, shown):
    """`shown` (what a worker or a table says) names the full hex version `full`."""
    return isinstance(shown, str) and len(shown) >= 12 and full.startswith(shown)


# --- a corral with coded kinds -------------------------------------------------------------------


def write_files(directory, files):
    """Makes `directory` hold exactly `files` ({path: bytes or str}); each file is written to a
    temporary name and renamed, as an editor or a deploy would."""
    os.makedirs(directory, exist_ok=True)
    want = {p: (v.encode() if isinstance(v, str) else v) for p, v in files.items()}
    for root, _, names in os.walk(directory):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), directory)
            if rel not in want:
                os.unlink(os.path.join(root, n))
    for p, data in want.items():
        path = os.path.join(directory, p)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    continue
        except FileNotFoundError:
            pass
        tmp = os.path.join(os.path.dirname(path), ".tmp-" + os.path.basename(path))
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, path)
    return want


class Kind:
    def __init__(self, name, lang, code_dir):
        self.name, self.lang, self.code_dir = name, lang, code_dir
        self.files = {}

    def write(self, files):
        self.files = write_files(self.code_dir, files)
        return version_of(self.files)


class Corral:
    """A running `corral serve` with kinds on "/<kind>/{id}/*", each with a code directory."""

    def __init__(self, srv, state_dir, kinds, events_path):
        self.srv = srv
        self.state_dir = state_dir
        self.kinds = kinds
        self.events_path = events_path

    # HTTP to the server
    def get(self, path, timeout=30):
        c = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def code(self, kind, key, timeout=30):
        """GET /<kind>/<key>/code: the worker's {version, hello, pid}; fails on another answer."""
        status, body = self.get(f"/{kind}/{key}/code", timeout=timeout)
        assert status == 200, (kind, key, status, body, self.srv.log()[-3000:])
        return json.loads(body)

    def start_all(self, kind, keys):
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            answers = list(ex.map(lambda k: self.code(kind, k, timeout=120), keys))
        return answers

    # the control API
    def state(self):
        status, body = control_request(self.state_dir, "GET", "/workers")
        assert status == 200, body
        return json.loads(body)

    def kinds_state(self):
        status, body = control_request(self.state_dir, "GET", "/workers/kinds")
        assert status == 200, body
        return json.loads(body)

    def rollout(self, kind, *args, timeout=120):
        """`corral ctl rollout KIND ARGS --json`: (exit status, report or None, stderr)."""
        r = ctl(self.state_dir, "rollout", kind, *args, "--json", timeout=timeout)
        try:
            report = json.loads(r.stdout) if r.stdout.strip() else None
        except ValueError:
            raise AssertionError(f"ctl rollout printed no JSON:\n{r.stdout}\n{r.stderr}")
        return r.returncode, report, r.stderr

    def rollout_ok(self, kind, *args, timeout=120):
        rc, report, err = self.rollout(kind, *args, timeout=timeout)
        assert rc == 0 and report is not None, (rc, report, err, self.srv.log()[-3000:])
        assert report["failed"] == 0, report
        return report

    def versions_of_workers(self, kind):
        return {a: e.get("version") for a, e in self.state().items()
                if a.startswith(kind + ":") and e.get("status") in ("starting", "running")}

    def wait_all_on(self, kind, version, count, timeout=30):
        def check():
            vs = self.versions_of_workers(kind)
            return len(vs) == count and all(v == version for v in vs.values())
        poll(check, timeout, what=f"{count} workers of {kind} on {version[:12]}",
             detail=lambda: f"{self.versions_of_workers(kind)}\n{self.srv.log()[-3000:]}")

    # the events rollout_worker.py writes
    def events(self):
        try:
            with open(self.events_path) as f:
                return [line.split()[1:] for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def wait_event(self, address, name, timeout=20):
        return poll(lambda: next((int(pid) for a, pid, e in self.events()
                                  if a == address and e == name), None), timeout,
                    what=f"{address} {name}", detail=lambda: self.srv.log()[-3000:])


@pytest.fixture
def corral(server_factory, tmp_path):
    """corral({kind: lang or (lang, {key: value})}, files={...}, workers="", args=()) -> Corral.

    Each kind gets the code directory <tmp>/code-<kind> (named relative to the config file),
    first holding `files` (default hello.txt = "A")."""

    def make(kinds, files=None, workers="", args=(), env=None):
        state = tmp_path / "state"
        events = tmp_path / "events.txt"
        lines = []
        if workers:
            lines += ["[workers]", workers]
        made = {}
        for name, spec in kinds.items():
            lang, keys = (spec, {}) if isinstance(spec, str) else spec
            argv = [CPP_WORKER] if lang == "cpp" else [PYTHON, PY_WORKER]
            kind = Kind(name, lang, str(tmp_path / f"code-{name}"))
            kind.write(files if files is not None else {"hello.txt": "A"})
            made[name] = kind
            kenv = {"ROLLOUT_WORKER_EVENTS": str(events), **(env or {})}
            lines += [f"[workers.{name}]",
                      f"command = [{', '.join(toml_str(a) for a in argv)}]",
                      f'routes = ["/{name}/{{id}}/*"]',
                      f'code = "code-{name}"',
                      "env = { " + ", ".join(f"{k} = {toml_str(v)}" for k, v in kenv.items())
                      + " }"]
            lines += [f"{k} = {toml_str(v) if isinstance(v, str) else v}" for k, v in keys.items()]
        srv = server_factory("--state-dir", str(state), *args, binary=CORRAL_BIN,
                             config="\n".join(lines) + "\n")
        c = Corral(srv, str(state), made, str(events))
        wait_control_socket(c.state_dir, 10, what="control socket")
        return c

    return make


def by_address(report):
    return {w["address"]: w for w in report["workers"]}


# --- under load: 20 rollouts, in place and by replacement ----------------------------------------


class Load:
    """Threads, each with one keep-alive connection, sending GET /<kind>/<key>/code in turn over
    `targets` [(kind, key)], `interval` apart per thread; every answer recorded as
    (kind, key, sent, received, status, version, hello) and every failure as
    (kind, key, sent, error)."""

    def __init__(self, host, port, targets, threads, interval):
        self.host, self.port = host, port
        self.targets, self.threads, self.interval = targets, threads, interval
        self.results, self.failures = [], []
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.workers = []

    def start(self):
        for i in range(self.threads):
            t = threading.Thread(target=self.run, args=(i,), daemon=True)
            t.start()
            self.workers.append(t)

    def run(self, i):
        mine = self.targets[i::self.threads]
        random.Random(i).shuffle(mine)
        conn = None
        n = 0
        results, failures = [], []
        while not self.stop_flag.is_set():
            kind, key = mine[n % len(mine)]
            n += 1
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=180)
            sent = time.monotonic()
            try:
                conn.request("GET", f"/{kind}/{key}/code")
                r = conn.getresponse()
                body = r.read()
                received = time.monotonic()
                if r.status != 200:
                    failures.append((kind, key, sent, f"status {r.status}: {body[:300]!r}"))
                else:
                    doc = json.loads(body)
                    results.append((kind, key, sent, received, r.status, doc.get("version"),
                                    doc.get("hello")))
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001 - every failure is reported
                failures.append((kind, key, sent, repr(e)))
                conn.close()
                conn = None
            wait = self.interval - (time.monotonic() - sent)
            if wait > 0:
                self.stop_flag.wait(wait)
        if conn is not None:
            conn.close()
        with self.lock:
            self.results += results
            self.failures += failures

    def stop(self):
        self.stop_flag.set()
        for t in self.workers:
            t.join(60)


def check_versions(results, rollouts, names):
    """Every response's version is allowed by the rollouts of its kind: with k the last rollout
    that had ended before the request was sent, the version of k, or that of a later rollout that
    had started before the response was read. Returns the violations."""
    bad = []
    for kind, key, sent, received, _, shown, hello in results:
        rolls = rollouts[kind]  # [(start, end, version)], [0] is the startup set
        k = max(i for i, r in enumerate(rolls) if r[1] <= sent)
        allowed = {rolls[k][2]} | {r[2] for r in rolls[k + 1:] if r[0] <= received}
        if not any(same_version(v, shown) for v in allowed):
            bad.append((kind, key, round(sent, 3), round(received, 3), shown, "allowed",
                        sorted(v[:12] for v in allowed)))
        elif names.get(next(v for v in allowed if same_version(v, shown))) != hello:
            bad.append((kind, key, "version", shown, "with hello", hello))
    return bad


def rollouts_under_load(corral, mode, rounds=20, per_kind=50):
    # A generous reload_timeout: on a busy machine 50 replacements can take longer than 30 s (the
    # default), and the test is about correctness, not time.
    keys = {"reload": mode, "reload_timeout": "180s"}
    kinds = {"cpp": ("cpp", keys), "py": ("py", keys)}
    if not have_cpp():
        del kinds["cpp"]
    c = corral(kinds, workers="max_starting = 8")
    names = {version_of({"hello.txt": b"A"}): "A", version_of({"hello.txt": b"B"}): "B"}
    t0 = time.monotonic()
    for kind in kinds:
        answers = c.start_all(kind, [f"k{i}" for i in range(per_kind)])
        v_a = version_of({"hello.txt": b"A"})
        assert all(same_version(v_a, a["version"]) and a["hello"] == "A" for a in answers), answers
    startup = time.monotonic()
    print(f"\n{mode}: {per_kind * len(kinds)} workers started in {startup - t0:.1f} s")
    pids = {a: e["pid"] for a, e in c.state().items()}
    assert len(pids) == per_kind * len(kinds), pids
    rollouts = {k: [(0.0, startup, version_of({"hello.txt": b"A"}))] for k in kinds}
    targets = [(k, f"k{i}") for k in kinds for i in range(per_kind)]
    # the request rate scales with the machine: a sanitized build on 2 cores gets less
    load = Load(c.srv.host, c.srv.port, targets, threads=8, interval=0.02 if SANITIZED else 0.005)
    load.start()
    reports = []
    took = []
    try:
        time.sleep(0.3)
        for r in range(1, rounds + 1):
            text = "B" if r % 2 else "A"
            for kind in kinds:
                c.kinds[kind].write({"hello.txt": text})

            def one(kind):
                start = time.monotonic()
                rc, report, err = c.rollout(kind, timeout=300)
                end = time.monotonic()
                return kind, start, end, rc, report, err

            with concurrent.futures.ThreadPoolExecutor(len(kinds)) as ex:
                done = list(ex.map(one, kinds))
            for kind, start, end, rc, report, err in done:
                assert rc == 0 and report, (
                    mode, r, kind, rc, err,
                    [w for w in (report or {}).get("workers", []) if "report" not in w],
                    c.srv.log()[-3000:])
                assert report["failed"] == 0 and names[report["version"]] == text, report
                rollouts[kind].append((start, end, report["version"]))
                reports.append(report)
                took.append(end - start)
                entries = by_address(report)
                assert len(entries) == per_kind, report
                want = {"restarted": True} if mode == "restart" else None
                for a, e in entries.items():
                    assert "error" not in e and "stopped" not in e, e
                    if want is not None:
                        assert e.get("report") == want, e
                    else:
                        assert "report" in e, e
            time.sleep(0.15)  # a moment of load on the new version before the next rollout
        time.sleep(0.3)
    finally:
        load.stop()
    print(f"{mode}: {rounds} rollouts x {len(kinds)} kinds, ctl took "
          f"median {sorted(took)[len(took) // 2] * 1000:.0f} ms, max {max(took) * 1000:.0f} ms; "
          f"took_ms max {max(r['took_ms'] for r in reports)}; "
          f"{len(load.results)} requests, {len(load.failures)} failed; "
          f"total {time.monotonic() - t0:.1f} s")
    assert not load.failures, load.failures[:10]
    assert len(load.results) > rounds * 10, len(load.results)
    bad = check_versions(load.results, rollouts, names)
    assert not bad, f"{len(bad)} responses from older code: {bad[:10]}"
    # the load overlapped the rollouts: requests sent and answered while one ran
    inside = [r for r in load.results
              if any(s <= r[2] and r[3] <= e for s, e, _ in rollouts[r[0]][1:])]
    assert inside, "no request was answered during a rollout"
    print(f"{mode}: {len(inside)} requests sent and answered while a rollout ran")
    # every version was served between rollouts (the load did reach the rolled-out code)
    for kind in kinds:
        served = {names.get(next((v for v in names if same_version(v, r[5])), None))
                  for r in load.results if r[0] == kind}
        assert served == {"A", "B"}, (kind, served)
        final = rollouts[kind][-1][2]
        c.wait_all_on(kind, final, per_kind)
        ks = c.kinds_state()[kind]
        assert ks["version"] == final and ks["dirty"] is False and ks["stale"] == 0, ks
    # in place: the same processes throughout; by replacement: every one is new
    now = {a: e["pid"] for a, e in c.state().items()}
    assert set(now) == set(pids), (now, pids)
    same = [a for a in pids if now[a] == pids[a]]
    if mode == "restart":
        assert not same, same
    else:
        assert len(same) == len(pids), [a for a in pids if now[a] != pids[a]]
    assert "worker_failed" not in c.srv.log()


def test_rollouts_under_load_in_place(corral):
    rollouts_under_load(corral, "in-place")


# --- a reload that throws -------------------------------------------------------------------------


@pytest.mark.parametrize("lang", ["cpp", "py"])
def test_reload_that_throws_keeps_the_old_version_and_the_kind_dirty(corral, lang):
    if lang == "cpp":
        need_cpp()
    c = corral({"k": (lang, {"reload": "in-place"})})
    keys = ["a", "b", "c"]
    v_a = version_of({"hello.txt": b"A"})
    for key in keys:
        assert c.code("k", key)["hello"] == "A"
    ks = c.kinds_state()["k"]
    assert ks["version"] == v_a and ks["dirty"] is False and ks["workers"] == 3, ks
    pids = {key: c.state()[f"k:{key}"]["pid"] for key in keys}
    # the new set has a reload-fails file: every worker's hook throws
    v_bad = c.kinds["k"].write({"hello.txt": "B", "reload-fails": ""})
    rc, report, err = c.rollout("k")
    assert rc == 1, (rc, report, err)
    assert report["version"] == v_bad and report["previous"] == v_a, report
    assert report["failed"] == 3, report
    for key in keys:
        e = by_address(report)[f"k:{key}"]
        assert isinstance(e.get("error"), dict) and e["error"].get("message"), e
        assert e["error"].get("code") == "reload_failed", e
    # the table (no --json) lists each worker with its error, and exits 1 too
    table = ctl(c.state_dir, "rollout", "k", timeout=60)
    assert table.returncode == 1, table.stdout + table.stderr
    for key in keys:
        line = next((l for l in table.stdout.splitlines() if f"k:{key}" in l), "")
        assert "error" in line, table.stdout
    # still serving the old version, same processes; the kind is dirty
    for key in keys:
        doc = c.code("k", key)
        assert doc["hello"] == "A" and same_version(v_a, doc["version"]), doc
        assert c.state()[f"k:{key}"]["pid"] == pids[key]
        assert c.state()[f"k:{key}"]["version"] == v_a
    ks = c.kinds_state()["k"]
    assert ks["version"] == v_bad and ks["dirty"] is True and ks["stale"] == 3, ks
    assert ks["rolling"] is False
    kinds = ctl(c.state_dir, "kinds")
    assert kinds.returncode == 0 and v_bad[:12] in kinds.stdout, kinds.stdout + kinds.stderr
    rows = [l.split() for l in kinds.stdout.splitlines() if l.strip()]
    head = [h.lower() for h in rows[0]]
    row = next(r for r in rows[1:] if r[0] == "k")
    assert "dirty" in head and row[head.index("dirty")] == "yes", kinds.stdout
    # a new address starts on the current set (with its reload-fails file: no reload at start)
    assert c.code("k", "new")["hello"] == "B"
    # the next good rollout applies and clears it
    v_good = c.kinds["k"].write({"hello.txt": "C"})
    report = c.rollout_ok("k")
    assert report["version"] == v_good
    assert set(by_address(report)) == {f"k:{key}" for key in keys + ["new"]}, report
    for key in keys + ["new"]:
        doc = c.code("k", key)
        assert doc["hello"] == "C" and same_version(v_good, doc["version"]), doc
        assert c.state()[f"k:{key}"]["pid"] == doc["pid"]
    for key in keys:
        assert c.state()[f"k:{key}"]["pid"] == pids[key]  # in place: the same processes
    ks = c.kinds_state()["k"]
    assert ks["dirty"] is False and ks["stale"] == 0, ks
    assert "worker_failed" not in c.srv.log()


# --- crashes, stops and starts during a rollout; failures cleared by the next ---------------------


def test_crash_kill_stop_and_start_during_a_rollout(corral, no_core_dumps):
    c = corral({"py": ("py", {"reload": "in-place", "stop_grace": "2s"})},
               env={"ROLLOUT_WORKER_SETUP_SLEEP": "py:slow=4000"})
    v_a = version_of({"hello.txt": b"A"})
    for key in ("ok", "crash", "killed", "stopme"):
        assert c.code("py", key)["hello"] == "A"
    # py:slow is starting (its setup sleeps 4 s after `started`) when the rollout begins
    slow_first = concurrent.futures.ThreadPoolExecutor(1).submit(c.code, "py", "slow")
    c.wait_event("py:slow", "setup_sleeping")
    assert c.state()["py:slow"]["status"] == "starting", c.state()
    hooks = {"crash": ["py:crash"], "sleep_ms": {"py:killed": 6000, "py:stopme": 6000}}
    v_b = c.kinds["py"].write({"hello.txt": "B", "test-hooks.json": json.dumps(hooks)})
    fut = concurrent.futures.ThreadPoolExecutor(1).submit(c.rollout, "py", timeout=60)
    killed = c.wait_event("py:killed", "reload_sleeping")
    os.kill(killed, signal.SIGKILL)
    c.wait_event("py:stopme", "reload_sleeping")
    r = ctl(c.state_dir, "stop", "py:stopme")
    assert r.returncode == 0, r.stdout + r.stderr
    # a worker started while the rollout runs gets the new set in its start
    ks = c.kinds_state()["py"]
    assert ks["rolling"] is True and ks["version"] == v_b, ks
    fresh = c.code("py", "fresh")
    assert fresh["hello"] == "B" and same_version(v_b, fresh["version"]), fresh
    rc, report, err = fut.result(timeout=60)
    assert rc == 1, (rc, report, err)
    entries = by_address(report)
    assert set(entries) == {"py:ok", "py:crash", "py:killed", "py:stopme", "py:slow"}, report
    assert "report" in entries["py:ok"], entries
    assert "report" in entries["py:slow"], entries
    assert entries["py:stopme"].get("stopped") is True, entries
    for a in ("py:crash", "py:killed"):
        assert isinstance(entries[a].get("error"), dict) and entries[a]["error"].get("message"), \
            entries
    assert report["failed"] == 2, report
    assert slow_first.result(timeout=30)["hello"] in ("A", "B")
    st = c.state()
    assert st["py:crash"]["status"] == "failed" and st["py:killed"]["status"] == "failed", st
    assert "py:stopme" not in st or st["py:stopme"]["status"] not in ("running", "starting"), st
    for key in ("ok", "slow", "fresh"):
        doc = c.code("py", key)
        assert doc["hello"] == "B" and same_version(v_b, doc["version"]), (key, doc)
    ks = c.kinds_state()["py"]
    assert ks["dirty"] is False and ks["rolling"] is False, ks
    # a failed address answers 503 until a rollout clears it
    assert c.get("/py/crash/code")[0] == 503
    v_c = c.kinds["py"].write({"hello.txt": "C"})
    report = c.rollout_ok("py")
    assert sorted(report["cleared"]) == ["py:crash", "py:killed"], report
    st = c.state()
    assert all(st.get(a, {}).get("status") != "failed" for a in ("py:crash", "py:killed")), st
    for key in ("crash", "killed", "stopme", "ok"):
        doc = c.code("py", key)
        assert doc["hello"] == "C" and same_version(v_c, doc["version"]), (key, doc)
    assert c.kinds_state()["py"]["dirty"] is False


def test_cpp_worker_killed_or_stopped_in_a_slow_reload(corral):
    """The C++ example's `reload-sleep-ms` holds its loop in the hook: a kill -9 or a `ctl stop`
    at any moment of the rollout lands before its reply (the stop: stop_grace 1 s, then the
    manager's kill, which it asked for)."""
    need_cpp()
    c = corral({"cpp": ("cpp", {"reload": "in-place", "stop_grace": "1s"})})
    for key in ("killed", "stopme"):
        assert c.code("cpp", key)["hello"] == "A"
    pid = c.state()["cpp:killed"]["pid"]
    v_b = c.kinds["cpp"].write({"hello.txt": "B", "reload-sleep-ms": "5000"})
    fut = concurrent.futures.ThreadPoolExecutor(1).submit(c.rollout, "cpp", timeout=60)
    poll(lambda: c.kinds_state()["cpp"]["rolling"], 10, what="the rollout running")
    os.kill(pid, signal.SIGKILL)
    r = ctl(c.state_dir, "stop", "cpp:stopme")
    assert r.returncode == 0, r.stdout + r.stderr
    rc, report, err = fut.result(timeout=60)
    assert rc == 1, (rc, report, err)
    entries = by_address(report)
    assert entries["cpp:killed"].get("error", {}).get("message"), entries
    assert entries["cpp:stopme"].get("stopped") is True, entries
    assert report["failed"] == 1, report
    assert c.state()["cpp:killed"]["status"] == "failed"
    # cleared by the next rollout, and started on its set by a request
    v_c = c.kinds["cpp"].write({"hello.txt": "C"})
    report = c.rollout_ok("cpp")
    assert report["cleared"] == ["cpp:killed"] and report["workers"] == [], report
    for key in ("killed", "stopme"):
        doc = c.code("cpp", key)
        assert doc["hello"] == "C" and same_version(v_c, doc["version"]), doc
    assert v_b != v_c


def test_failed_address_cleared_by_a_rollout_starts_on_the_next_request(corral, no_core_dumps):
    langs = {"py": "py"}
    if have_cpp():
        langs["cpp"] = "cpp"
    c = corral({k: (lang, {"reload": "in-place"}) for k, lang in langs.items()})
    for kind in langs:
        assert c.code(kind, "x")["hello"] == "A"
        assert c.code(kind, "y")["hello"] == "A"
        status, _ = c.get(f"/{kind}/x/crash")
        assert status >= 500
        poll(lambda: c.state().get(f"{kind}:x", {}).get("status") == "failed", 10,
             what=f"{kind}:x failed")
        assert c.get(f"/{kind}/x/code")[0] == 503
        v_b = c.kinds[kind].write({"hello.txt": "B"})
        report = c.rollout_ok(kind)
        assert report["cleared"] == [f"{kind}:x"], report
        assert set(by_address(report)) == {f"{kind}:y"}, report
        assert c.state().get(f"{kind}:x", {}).get("status") != "failed", c.state()
        doc = c.code(kind, "x")
        assert doc["hello"] == "B" and same_version(v_b, doc["version"]), doc
        assert c.state()[f"{kind}:x"]["version"] == v_b


def test_a_reload_whose_caller_gave_up_is_still_handled(corral):
    c = corral({"py": ("py", {"reload": "in-place", "reload_timeout": "1s"})})
    for key in ("late", "quick"):
        assert c.code("py", key)["hello"] == "A"
    v_a = version_of({"hello.txt": b"A"})
    v_b = c.kinds["py"].write({"hello.txt": "B",
                               "test-hooks.json": json.dumps({"sleep_ms": {"py:late": 4000}})})
    rc, report, err = c.rollout("py")
    assert rc == 1, (rc, report, err)
    assert report["took_ms"] < 3500, f"the rollout waited for the slow reply: {report}"
    entries = by_address(report)
    assert entries["py:late"].get("error", {}).get("code") == "reload_timeout", entries
    assert "report" in entries["py:quick"], entries
    # meanwhile the late worker still runs the old version: dirty
    assert c.state()["py:late"]["version"] == v_a
    assert c.kinds_state()["py"]["dirty"] is True
    # its reply comes (4 s): the worker is on the new version, the kind clean
    poll(lambda: c.state()["py:late"].get("version") == v_b, 10, what="the late reply handled",
         detail=lambda: f"{c.state()}\n{c.srv.log()[-3000:]}")
    assert c.kinds_state()["py"]["dirty"] is False
    doc = c.code("py", "late")
    assert doc["hello"] == "B" and same_version(v_b, doc["version"])
    # its reload slot is free: the next rollout reaches it at once
    v_c = c.kinds["py"].write({"hello.txt": "C"})
    report = c.rollout_ok("py")
    assert "report" in by_address(report)["py:late"], report
    assert same_version(v_c, c.code("py", "late")["version"])


# --- --watch --------------------------------------------------------------------------------------


def test_watch_reaches_every_live_worker(corral):
    lang = "cpp" if have_cpp() else "py"
    n = 100
    c = corral({"w": lang}, args=("--watch",), workers="max_starting = 8")
    c.start_all("w", [f"n{i}" for i in range(n)])
    v_a = version_of({"hello.txt": b"A"})
    c.wait_all_on("w", v_a, n)
    marks = c.srv.log().count("rollout_done")
    # one save of a file in the code directory
    t_write = time.monotonic()
    path = os.path.join(c.kinds["w"].code_dir, "hello.txt")
    with open(path, "w") as f:
        f.write("B")
    v_b = version_of({"hello.txt": b"B"})
    deadline = t_write + 30
    while True:
        vs = c.versions_of_workers("w")
        if len(vs) == n and all(v == v_b for v in vs.values()):
            t_last = time.monotonic()
            break
        assert time.monotonic() < deadline, f"not every worker on B: {vs}\n{c.srv.log()[-3000:]}"
        time.sleep(0.005)
    m = c.srv.wait_log(r"rollout_done kind=\"?w\"?[^\n]*took_ms=(\d+)", timeout=10)
    print(f"\n--watch: {n} {lang} workers, write -> last worker on the new version: "
          f"{(t_last - t_write) * 1000:.0f} ms (the rollout's took_ms={m.group(1)}; goal < 1 s)")
    assert c.srv.log().count("rollout_done") == marks + 1  # one save, one rollout
    for i in range(0, n, 10):
        assert c.code("w", f"n{i}")["hello"] == "B"
    ks = c.kinds_state()["w"]
    assert ks["version"] == v_b and ks["dirty"] is False, ks
    # a burst of writes settles into one rollout (or few), ending on the last content
    for i in range(20):
        with open(path, "w") as f:
            f.write(f"burst {i}")
    v_last = version_of({"hello.txt": b"burst 19"})
    c.wait_all_on("w", v_last, n, timeout=30)
    poll(lambda: c.kinds_state()["w"]["rolling"] is False, 10, what="the watch's rollouts done")
    assert c.srv.log().count("rollout_done") - marks - 1 <= 5, "a burst was not coalesced"
    # a new file in a new subdirectory is seen too
    os.makedirs(os.path.join(c.kinds["w"].code_dir, "sub"))
    with open(os.path.join(c.kinds["w"].code_dir, "sub", "x.txt"), "w") as f:
        f.write("x")
    v_sub = version_of({"hello.txt": b"burst 19", "sub/x.txt": b"x"})
    c.wait_all_on("w", v_sub, n, timeout=30)
    with open(os.path.join(c.kinds["w"].code_dir, "sub", "x.txt"), "w") as f:
        f.write("y")
    c.wait_all_on("w", version_of({"hello.txt": b"burst 19", "sub/x.txt": b"y"}), n, timeout=30)
    assert "worker_failed" not in c.srv.log()


# --- rollback -------------------------------------------------------------------------------------


def test_rollback_with_to_restores_the_first_version_everywhere(corral):
    langs = {"py": ("py", {"reload": "in-place"})}
    if have_cpp():
        langs["cpp"] = ("cpp", {"reload": "restart"})
    c = corral(langs)
    keys = ["a", "b", "c", "d"]
    for kind in langs:
        c.start_all(kind, keys)
    v_a = version_of({"hello.txt": b"A"})
    for kind in langs:
        for text in ("B", "C"):
            c.kinds[kind].write({"hello.txt": text})
            c.rollout_ok(kind)
        assert all(c.code(kind, k)["hello"] == "C" for k in keys)
        # back to the first version by its full hex
        report = c.rollout_ok(kind, "--to", v_a)
        assert report["version"] == v_a, report
        assert report["previous"] == version_of({"hello.txt": b"C"}), report
        assert len(report["workers"]) == len(keys), report
        for k in keys:
            doc = c.code(kind, k)
            assert doc["hello"] == "A" and same_version(v_a, doc["version"]), doc
        c.wait_all_on(kind, v_a, len(keys))
        # a new worker starts on it too, though the directory says C
        doc = c.code(kind, "new")
        assert doc["hello"] == "A" and same_version(v_a, doc["version"]), doc
        ks = c.kinds_state()[kind]
        assert ks["version"] == v_a and ks["dirty"] is False, ks
        current = [v for v in ks["versions"] if v.get("current")]
        assert [v["version"] for v in current] == [v_a], ks
        assert {v["version"] for v in ks["versions"]} >= {
            v_a, version_of({"hello.txt": b"B"}), version_of({"hello.txt": b"C"})}, ks
        # by a prefix (12 digits) to B, and an unknown version is refused
        v_b = version_of({"hello.txt": b"B"})
        report = c.rollout_ok(kind, "--to", v_b[:12])
        assert report["version"] == v_b
        assert all(c.code(kind, k)["hello"] == "B" for k in keys + ["new"])
        rc, report, err = c.rollout(kind, "--to", "0123456789abcdef")
        assert rc == 1, (rc, report, err)
        assert c.kinds_state()[kind]["version"] == v_b


# --- the snapshot store through the binary --------------------------------------------------------


def store_paths(state_dir, kind):
    root = os.path.join(state_dir, "code")
    return os.path.join(root, "objects"), os.path.join(root, "versions", kind)


def kept_versions(state_dir, kind):
    _, vdir = store_paths(state_dir, kind)
    return {n for n in os.listdir(vdir) if not n.startswith(".") and
            os.path.isdir(os.path.join(vdir, n))}


def objects(state_dir):
    odir, _ = store_paths(state_dir, "")
    return {n for n in os.listdir(odir) if not n.startswith(".")}


def test_snapshot_store_shares_files_and_collects_old_versions(corral):
    lang = "cpp" if have_cpp() else "py"
    shared = "shared content\n" * 100
    c = corral({"s": (lang, {"reload": "in-place"})},
               files={"hello.txt": "A", "lib/shared.txt": shared})
    odir, vdir = store_paths(c.state_dir, "s")
    v_a = version_of({"hello.txt": b"A", "lib/shared.txt": shared.encode()})
    assert kept_versions(c.state_dir, "s") == {v_a}
    assert c.code("s", "w")["hello"] == "A"
    assert c.state()["s:w"]["version"] == v_a
    # the manifest and the tree of the version; files read-only, linked to their objects
    with open(os.path.join(vdir, v_a + ".json")) as f:
        manifest = json.load(f)
    assert manifest["version"] == v_a
    assert manifest["files"] == [{"path": "hello.txt", "digest": digest(b"A")},
                                 {"path": "lib/shared.txt", "digest": digest(shared.encode())}]
    obj = os.stat(os.path.join(odir, digest(shared.encode())))
    assert obj.st_mode & 0o777 == 0o444
    # B shares lib/shared.txt with A: one inode in both trees and in objects/
    v_b = c.kinds["s"].write({"hello.txt": "B", "lib/shared.txt": shared})
    assert c.rollout_ok("s")["version"] == v_b
    ino = {os.stat(os.path.join(vdir, v, "lib", "shared.txt")).st_ino for v in (v_a, v_b)}
    assert ino == {obj.st_ino}, ino
    assert os.stat(os.path.join(vdir, v_a, "hello.txt")).st_ino != \
        os.stat(os.path.join(vdir, v_b, "hello.txt")).st_ino
    assert objects(c.state_dir) == {digest(b"A"), digest(b"B"), digest(shared.encode())}
    with open(os.path.join(vdir, "history")) as f:
        assert f.read().split() == [v_a, v_b]
    # the same content again is the same version, stored once (the history gains a line)
    c.kinds["s"].write({"hello.txt": "A", "lib/shared.txt": shared})
    assert c.rollout_ok("s")["version"] == v_a
    assert kept_versions(c.state_dir, "s") == {v_a, v_b}
    # a version no worker runs and beyond the kept ones is removed with its own objects: the
    # worker stays on Z (every later set has a reload-fails file), six more versions are made
    v_z = c.kinds["s"].write({"hello.txt": "Z only"})
    c.rollout_ok("s")
    assert c.state()["s:w"]["version"] == v_z
    later = []
    for i in range(6):
        later.append(c.kinds["s"].write({"hello.txt": f"later {i}", "reload-fails": ""}))
        rc, report, _ = c.rollout("s")
        assert rc == 1 and report["failed"] == 1, report
    assert c.state()["s:w"]["version"] == v_z
    kept = kept_versions(c.state_dir, "s")
    assert kept == set(later[-5:]) | {v_z}, (kept, later)  # Z kept: a worker runs it
    assert digest(b"Z only") in objects(c.state_dir)
    assert digest(shared.encode()) not in objects(c.state_dir)
    assert not os.path.exists(os.path.join(vdir, v_a)) and \
        not os.path.exists(os.path.join(vdir, v_a + ".json"))
    # the worker moves on: Z, no longer run nor among the last five, goes with its object
    v_ok = c.kinds["s"].write({"hello.txt": "fine"})
    c.rollout_ok("s")
    assert c.state()["s:w"]["version"] == v_ok
    kept = kept_versions(c.state_dir, "s")
    assert v_z not in kept and len(kept) == 5, kept
    assert digest(b"Z only") not in objects(c.state_dir)
    # 50 rollouts through ctl: no growth beyond the kept versions and their objects
    for i in range(50):
        c.kinds["s"].write({"hello.txt": f"round {i}", "lib/shared.txt": shared})
        c.rollout_ok("s")
    kept = kept_versions(c.state_dir, "s")
    assert len(kept) == 5, kept
    assert objects(c.state_dir) == {digest(f"round {i}".encode()) for i in range(45, 50)} | {
        digest(shared.encode())}
    with open(os.path.join(vdir, "history")) as f:
        assert set(f.read().split()) == kept
    leftovers = [n for n in os.listdir(vdir) if n.startswith(".tmp")] + \
        [n for n in os.listdir(odir) if n.startswith(".")]
    assert not leftovers, leftovers
    manifests = {n[:-5] for n in os.listdir(vdir) if n.endswith(".json")}
    assert manifests == kept
    assert c.code("s", "w")["hello"] == "round 49"


# --- refusals -------------------------------------------------------------------------------------


def test_rollout_refusals(corral):
    c = corral({"k": "py"})
    r = ctl(c.state_dir, "rollout", "nokind", timeout=30)
    assert r.returncode == 1 and r.stderr.strip(), r.stdout + r.stderr
    status, body = control_request(c.state_dir, "POST", "/workers/kinds/nokind/rollout")
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown_kind", body
    rc, _, err = c.rollout("k", "--to", "ffffffffffff")
    assert rc == 1 and err.strip()
    ks = c.kinds_state()
    assert ks["k"]["version"] == version_of({"hello.txt": b"A"}), ks
    assert [v["version"] for v in ks["k"]["versions"]] == [ks["k"]["version"]], ks
    # the version in `start`: a new worker's /code and its state entry
    doc = c.code("k", "one")
    assert same_version(ks["k"]["version"], doc["version"]) and doc["hello"] == "A"
    assert c.state()["k:one"]["version"] == ks["k"]["version"]


def test_kind_without_code_refuses_a_rollout(server_factory, tmp_path):
    state = tmp_path / "state"
    config = (f"[workers.plain]\ncommand = [{toml_str(PYTHON)}, "
              f"{toml_str(os.path.join(REPO, 'examples', 'worker_python', 'worker.py'))}]\n"
              'routes = ["/plain/{id}/*"]\n')
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config)
    wait_control_socket(str(state), 10)
    status, body = control_request(str(state), "POST", "/workers/kinds/plain/rollout")
    assert status == 409 and json.loads(body)["error"]["code"] == "no_code", body
    r = ctl(str(state), "rollout", "plain", timeout=30)
    assert r.returncode == 1, r.stdout + r.stderr
    status, body = control_request(str(state), "GET", "/workers/kinds")
    assert status == 200 and json.loads(body)["plain"]["version"] is None, body
    srv.stop()


def test_serve_refuses_a_missing_code_dir(server_factory, tmp_path):
    state = tmp_path / "state"
    config = (f"[workers.k]\ncommand = [{toml_str(PYTHON)}, {toml_str(PY_WORKER)}]\n"
              'routes = ["/k/{id}/*"]\ncode = "does-not-exist"\n')
    srv = server_factory("--state-dir", str(state), binary=CORRAL_BIN, config=config, wait=False)
    assert srv.wait_exit(timeout=20) != 0
    assert "does-not-exist" in srv.log(), srv.log()
