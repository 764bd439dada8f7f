#!/usr/bin/python3
"""A test double for corral's worker manager: speaks docs/worker-protocol.md (fd 3 control link,
fd 4 listening socket, the flock lock) and misbehaves as its start data says. Standard library only.

Start data keys (all optional):
  mode: "normal" | "never_started" | "crash_before_ready" | "crash_after_ready" | "fatal"
        | "close_link" | "ignore_shutdown" | "no_lock"
  slow_ready: ms between `started` and `ready`         idle: the idle flag of `ready` (default true)
  idle_after: ms after ready, send {idle: true}         crash_after: ms (crash_after_ready, default 50)
  exit_on_shutdown_slowly: ms to wait after `shutdown` before exiting
  events: a file to append "<monotonic> <pid> <event>" lines to (started, ready, exiting)
Every connection to fd 4 gets "hello <address>\n".
"""
import fcntl
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time

address = os.environ["CORRAL_ADDRESS"]
control = socket.socket(fileno=int(os.environ["CORRAL_CONTROL_FD"]))
listener = socket.socket(fileno=int(os.environ["CORRAL_LISTEN_FD"]))
events_path = None


def event(name):
    if events_path:
        with open(events_path, "a") as f:
            f.write(f"{time.monotonic():.6f} {os.getpid()} {name}\n")


def send(msg):
    control.send(json.dumps(msg).encode())


def serve():
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall(f"hello {address}\n".encode())


def main():
    global events_path
    signal.signal(signal.SIGTERM, lambda *a: (event("exiting"), os._exit(0)))
    msg = json.loads(control.recv(65536))
    assert msg["type"] == "start", msg
    data = msg.get("start") or {}
    events_path = data.get("events")
    mode = data.get("mode", "normal")
    print(f"starting {address}", flush=True)
    print(f"stderr line for {address}", file=sys.stderr, flush=True)
    if mode == "never_started":
        time.sleep(3600)
    if mode != "no_lock":
        lock = os.open(msg["lock"], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocking: waits for an old worker's exit
    event("started")
    send({"type": "started"})
    if mode == "fatal":
        print("the secret is SECRET-42", file=sys.stderr, flush=True)
        send({"type": "fatal", "error": {"message": "public message", "code": "E_TEST",
                                         "detail": "SECRET-42"}})
        time.sleep(0.05)
        os._exit(1)
    if mode == "crash_before_ready":
        time.sleep(data.get("crash_after", 50) / 1000)
        os._exit(3)
    threading.Thread(target=serve, daemon=True).start()
    time.sleep(data.get("slow_ready", 0) / 1000)
    send({"type": "ready", "idle": data.get("idle", True)})
    event("ready")
    if mode == "close_link":
        time.sleep(0.02)
        control.close()
        time.sleep(3600)
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ)
    deadline_idle = time.monotonic() + data["idle_after"] / 1000 if "idle_after" in data else None
    deadline_crash = (time.monotonic() + data.get("crash_after", 50) / 1000
                      if mode == "crash_after_ready" else None)
    while True:
        now = time.monotonic()
        waits = [d - now for d in (deadline_idle, deadline_crash) if d is not None]
        ready = sel.select(max(0, min(waits)) if waits else None)
        now = time.monotonic()
        if deadline_crash is not None and now >= deadline_crash:
            os._exit(3)
        if deadline_idle is not None and now >= deadline_idle:
            deadline_idle = None
            send({"type": "idle", "idle": True})
        if not ready:
            continue
        raw = control.recv(65536)
        if not raw:  # the manager went away: exit like the worker library does
            event("exiting")
            os._exit(0)
        m = json.loads(raw)
        if m.get("type") == "shutdown":
            if mode == "ignore_shutdown":
                continue
            time.sleep(data.get("exit_on_shutdown_slowly", 0) / 1000)
            event("exiting")
            print(f"bye from {address}", flush=True)
            os._exit(0)


main()
