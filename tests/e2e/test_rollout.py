"""Rollout (issue 13, docs/deploying.md): new code of a worker kind reaches every live worker, in
place or by replacement, with no request lost. Driven from outside on the real binary
(`corral serve` with `[workers.<kind>] code = "..."`) and the example workers, C++
(examples/worker_cpp) and Python (examples/worker_python, here through tests/e2e/rollout_worker.py,
which adds test hooks around the example's reload hook), whose `GET /code` answers
{"version": <the version it runs>, "hello": <its hello.txt>, "pid": N}.

What is checked (the acceptance list of issue 13), here and in the files split from this one so
that each ctest entry stays within a couple of minutes on a busy sanitized machine (they import
this file's fixture and helpers):
  * under load (threads with keep-alive connections on 50 addresses of each language), 20
    rollouts alternating two versions, in place (here) and by replacement
    (test_rollout_replacement.py: 6 rollouts on 20 addresses of each): no failed request,
    and no response from code older than the version whose rollout had completed before the
    request was sent (each response names its version; every one is checked against the rollouts'
    start and end times);
  * test_rollout_failures.py: a reload that throws (a `reload-fails` file): listed with its
    error, exit status 1, the old version still served, the kind dirty; the next good rollout
    applies and clears it;
  * there too, during one rollout: a reload that crashes (the hook aborts) and a worker killed
    with -9 in its reload are listed with an error and their addresses failed; a worker stopped
    (`ctl stop`) during its reload is listed `stopped`; a worker starting when the rollout began
    reloads after its `ready` and ends on the new version; a worker started during the rollout
    is not in the report and runs the new version; the next rollout clears the failed
    addresses, and a request starts each on the new version; and a reload whose caller gave up
    (reload_timeout) still has its late reply handled;
  * test_rollout_watch.py, `--watch`: a file written in a code directory reaches 100 live
    workers (the time from the write to the last one on the new version is printed; only
    correctness is asserted);
  * test_rollout_store.py: rollback with `--to` (full version and a prefix) restores the earlier
    version everywhere; the snapshot store under <state>/code: the version is the SHA-256 of the
    contract's lines, two versions sharing a file store it once (one inode), a version is
    removed once it is neither kept nor run, and a dozen rollouts leave only the kept versions
    and their objects;
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
