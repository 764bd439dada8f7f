"""Rollout failures (issue 13, docs/deploying.md), split from test_rollout.py (one ctest entry
each, so that no entry runs for minutes): a reload that throws (the old version kept, the kind
dirty, cleared by the next good rollout); a crash, a kill -9 and a `ctl stop` during a rollout,
a worker starting when it begins and one started during it; the C++ worker killed or stopped in
a slow reload; a failed address cleared by a rollout and started on the next request; a reload
whose caller gave up (reload_timeout) still handled. test_rollout.py says what the workers and
the fixture are.
"""
import concurrent.futures
import json
import os
import signal

import pytest

from corral_test_util import ctl, poll
import test_rollout
from test_rollout import by_address, have_cpp, need_cpp, same_version, version_of

corral = test_rollout.corral  # the fixture, shared with test_rollout.py


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
