#!/usr/bin/python3
"""The Python example worker (examples/worker_python/worker.py) with test hooks around its reload
hook, for tests/e2e/test_rollout.py: what a rollout must survive, made to happen at a chosen
moment and for a chosen address. Standard library only; the application (the counter, GET /code,
the reload hook that re-reads hello.txt and throws on a `reload-fails` file) is the example's own,
imported from its file, so the tests exercise the real library.

The hooks, read from the code set a reload brings (the file `test-hooks.json` in its snapshot
directory), keyed by the address's wire form:
  {"sleep_ms": {"py:a": 3000, "*": 100},   sleep this long before the example's hook runs
   "crash": ["py:b"]}                       abort (SIGABRT) instead of reloading
and from the environment (a kind's `env`):
  ROLLOUT_WORKER_SETUP_SLEEP = "py:slow=2000,py:other=500"   sleep in setup (between `started`
                                                             and `ready`: a reload then queues)
  ROLLOUT_WORKER_EVENTS = PATH   appends "<monotonic> <address> <pid> <event>" lines:
                                 setup_sleeping, reload_sleeping, reload_crashing,
                                 reload_calling (the example's hook is called), reload_returned
Without a `test-hooks.json` and the variables it is the example worker.
"""
import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "corral_example_worker", os.path.join(REPO, "examples", "worker_python", "worker.py"))
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def event(address, name):
    path = os.environ.get("ROLLOUT_WORKER_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.monotonic():.6f} {address} {os.getpid()} {name}\n")


def setup_sleep_ms(address):
    for item in os.environ.get("ROLLOUT_WORKER_SETUP_SLEEP", "").split(","):
        name, _, ms = item.rpartition("=")
        if name == address and ms.isdigit():
            return int(ms)
    return 0


def hooks_of(update):
    try:
        with open(os.path.join(update.get("dir") or "", "test-hooks.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def setup(runtime):
    address = runtime.address
    ms = setup_sleep_ms(address)
    if ms:
        event(address, "setup_sleeping")
        time.sleep(ms / 1000)
    register = getattr(runtime, "on_reload", None)
    if register is not None:
        def on_reload(fn):
            def wrapped(update):
                hooks = hooks_of(update)
                if address in hooks.get("crash", []):
                    event(address, "reload_crashing")
                    os.abort()
                sleeps = hooks.get("sleep_ms", {})
                ms = sleeps.get(address, sleeps.get("*", 0))
                if ms:
                    event(address, "reload_sleeping")
                    time.sleep(ms / 1000)
                event(address, "reload_calling")
                report = fn(update)
                event(address, "reload_returned")
                return report
            return register(wrapped)
        runtime.on_reload = on_reload
    return example.setup(runtime)


if __name__ == "__main__":
    if "CORRAL_CONTROL_FD" not in os.environ or "CORRAL_LISTEN_FD" not in os.environ:
        sys.stderr.write("not started by a worker manager: CORRAL_CONTROL_FD/CORRAL_LISTEN_FD"
                         " unset\n")
        sys.exit(78)
    sys.exit(example.WorkerRuntime(setup, example.redact).run())
