"""The snapshot store and rollback through the binary (issue 13, docs/deploying.md), split from
test_rollout.py: rollback with `--to` (a full version and a prefix) restores the earlier version
everywhere; under <state>/code the version is the SHA-256 of the contract's lines, two versions
sharing a file store it once (one inode), a version is removed once it is neither kept nor run,
and a dozen rollouts leave only the kept versions and their objects. test_rollout.py says what
the workers and the fixture are.
"""
import json
import os

import test_rollout
import test_rollout
from test_rollout import digest, have_cpp, same_version, version_of

corral = test_rollout.corral  # the fixture, shared with test_rollout.py


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
    # more rollouts through ctl than twice the kept versions: no growth beyond the kept versions
    # and their objects (each rollout runs `corral ctl`, a second or more under ASan)
    rounds = 12
    for i in range(rounds):
        c.kinds["s"].write({"hello.txt": f"round {i}", "lib/shared.txt": shared})
        c.rollout_ok("s")
    kept = kept_versions(c.state_dir, "s")
    assert len(kept) == 5, kept
    assert objects(c.state_dir) == {digest(f"round {i}".encode())
                                    for i in range(rounds - 5, rounds)} | {digest(shared.encode())}
    with open(os.path.join(vdir, "history")) as f:
        assert set(f.read().split()) == kept
    leftovers = [n for n in os.listdir(vdir) if n.startswith(".tmp")] + \
        [n for n in os.listdir(odir) if n.startswith(".")]
    assert not leftovers, leftovers
    manifests = {n[:-5] for n in os.listdir(vdir) if n.endswith(".json")}
    assert manifests == kept
    assert c.code("s", "w")["hello"] == f"round {rounds - 1}"
