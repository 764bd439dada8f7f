"""`corral serve --watch` (issue 13, docs/deploying.md), split from test_rollout.py: a file written
in a code directory reaches 100 live workers (the time from the write to the last one on the new
version is printed; only correctness is asserted), a burst of writes is coalesced, and a new
subdirectory is seen. test_rollout.py says what the workers and the fixture are.
"""
import os
import time

from corral_test_util import poll
import test_rollout
from test_rollout import have_cpp, version_of

corral = test_rollout.corral  # the fixture, shared with test_rollout.py


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
