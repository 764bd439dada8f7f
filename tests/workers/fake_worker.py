#!/usr/bin/python3
"""A test double for corral's worker manager: speaks docs/worker-protocol.md (fd 3 control link,
fd 4 listening socket, the flock lock) and misbehaves as its start data says. Standard library only.

Start data keys (all optional):
  mode: "normal" | "exit_at_start" | "never_started" | "never_ready" | "crash_before_ready"
        | "crash_after_ready"
        | "fatal" | "close_link" | "close_link_before_ready" | "ignore_shutdown" | "no_lock"
        (exit_at_start: exits 3 on `start`, before its lock and `started`; close_link_before_ready: closes fd 3 after `started` and ignores SIGTERM, so only the
        manager's SIGKILL after stop_grace ends it; never_ready: takes its lock, sends `started`
        and then nothing, a setup that never ends, and ignores SIGTERM)
  daemon: a file; after `ready` the worker daemonizes a grandchild (fork, setsid, fork) that
        writes its pid there and sleeps: a process outside the worker's group and session
  slow_ready: ms between `started` and `ready`         idle: the idle flag of `ready` (default true)
  idle_after: ms after ready, send {idle: true}         crash_after: ms (crash_after_ready, default 50)
  exit_on_shutdown_slowly: ms to wait after `shutdown` before exiting
  accept_after: ms after `ready` before the first accept (a worker slow to take the connections
        waiting for it, as under load; it still says idle meanwhile)
  shutdown_exit_code: the exit status after `shutdown` (default 0; non-zero: a crash while stopping)
  events: a file to append "<monotonic> <pid> <event>" lines to (started, ready, accepting, exiting,
        reload_got:<id>, reload_replied:<id>)
  reload: whether `ready` says `reload: true` (default true); false: a `reload` is answered with
        the no_reload error, as the worker libraries do without a hook
  reload_delay: ms between a `reload` and its `reloaded` (default 0)
  ping: whether `ready` says `ping: true` (default false); a `ping` is answered with its `pong`
  pongs: how many pings it answers (default: all); after that it stops answering them while the
        rest of it goes on (reads its link, obeys `shutdown`): a worker whose loop is stuck
  counts: {requests, upgraded, busy}, added to `ready` (and to the idle_after report, as zeros)
The heartbeat (issue 14): events ping:<id> and pong:<id>.
The reload protocol (issue 13): a `reload` that comes before `ready` waits for it; reloads are
applied one at a time, in order. What a reload does is chosen by the file names of its set (so one
worker can fail one rollout and take the next): "reload-fails" (an error reply, code
reload_failed), "reload-crashes" (exit 3), "reload-exits" (exit 0, unasked), "reload-never" (no
reply), "reload-delay-<ms>" (the reply that much later). A successful reply's report is
{"pid", "version", "files"} and the worker then runs the new version.
Every connection to fd 4 gets "hello <address>\n" (" version=<version>\n" instead of the newline
once the worker runs a set with a version) (with FAKE_WORKER_HTTP=1 in the environment,
as the body of an HTTP/1.1 200 response, for tests through the real binary; with
FAKE_WORKER_INTERIM=1 too, the 200 comes after a 100 Continue and a 103 Early Hints, each in its
own write). FAKE_WORKER_START, a
JSON object in the environment (a kind's `env` in corral's config, which has no start hook), gives
defaults for the start data.
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

# A warm spare (issue 14) has no CORRAL_ADDRESS: it sends `standby` (unless FAKE_WORKER_STANDBY=0,
# as a library that predates it) and learns its address from `start`. FAKE_WORKER_SPARE_EVENTS: a
# file to append "<monotonic> <pid> standby" to. FAKE_WORKER_SPARE_DIES: a file; the first spare
# to make it (O_EXCL) exits 1 on its `start`, before `started`: a spare killed while being bound.
address = os.environ.get("CORRAL_ADDRESS", "")
control = socket.socket(fileno=int(os.environ["CORRAL_CONTROL_FD"]))
listener = socket.socket(fileno=int(os.environ["CORRAL_LISTEN_FD"]))
events_path = None
version = None  # the code version it runs (from `start`, then from each reload applied)


def event(name):
    if events_path:
        with open(events_path, "a") as f:
            f.write(f"{time.monotonic():.6f} {os.getpid()} {name}\n")


def send(msg):
    control.send(json.dumps(msg).encode())


ready_sent = threading.Event()


def serve(accept_after_ms):
    if accept_after_ms:
        ready_sent.wait()
        time.sleep(accept_after_ms / 1000)
        event("accepting")
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            body = (f"hello {address} version={version}\n" if version
                    else f"hello {address}\n").encode()
            if os.environ.get("FAKE_WORKER_HTTP") == "1":
                try:
                    conn.settimeout(5)
                    head = b""
                    while b"\r\n\r\n" not in head:
                        b = conn.recv(65536)
                        if not b:
                            break
                        head += b
                    head, _, rest = head.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(rest) < length:  # the body, so the close is not a reset
                        b = conn.recv(65536)
                        if not b:
                            break
                        rest += b
                    if os.environ.get("FAKE_WORKER_INTERIM") == "1":
                        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                        time.sleep(0.01)
                        conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
                        time.sleep(0.01)
                except OSError:
                    continue
                body = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body)) + body
            try:
                conn.sendall(body)
            except OSError:
                pass


def files_of(m):
    """The set's files of a `start` or `reload`: its manifest's (`code.manifest`, the set sent by
    reference) when there is one, else the inline `scripts`."""
    manifest = (m.get("code") or {}).get("manifest")
    if manifest:
        with open(manifest) as f:
            return json.load(f).get("files") or []
    return m.get("scripts") or []


def reload_plan(m, data):
    """What a `reload` does: (delay ms, action), action one of ok, fails, crashes, exits, never."""
    names = [f.get("path", "") for f in files_of(m)]
    delay = data.get("reload_delay", 0)
    action = "ok" if data.get("reload", True) else "no_hook"
    for n in names:
        if n.startswith("reload-delay-"):
            delay = int(n[len("reload-delay-"):])
        elif n in ("reload-fails", "reload-crashes", "reload-exits", "reload-never"):
            action = n[len("reload-"):]
    return delay, action


def apply_reload(m, action):
    """Replies to `m` (a reload) as `action` says; exits for crashes/exits."""
    global version
    if action == "crashes":
        os._exit(3)
    if action == "exits":
        event("exiting")
        os._exit(0)
    if action == "never":
        return
    new = (m.get("code") or {}).get("version")
    reply = {"type": "reloaded", "id": m["id"], "version": new}
    if action == "fails":
        reply["version"] = version
        reply["error"] = {"message": "the reload failed", "code": "reload_failed",
                          "detail": "SECRET-RELOAD"}
    elif action == "no_hook":
        reply["version"] = version
        reply["error"] = {"message": "This worker cannot reload in place.", "code": "no_reload"}
    else:
        version = new
        reply["report"] = {"pid": os.getpid(), "version": new,
                           "files": len(files_of(m))}
    send(reply)
    event(f"reload_replied:{m['id']}")


def daemonize(path):
    """fork, setsid, fork: a grandchild in a session of its own writes its pid to `path`."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    for fd in range(3, 64):
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        time.sleep(3600)


def main():
    global events_path, version
    global address
    signal.signal(signal.SIGTERM, lambda *a: (event("exiting"), os._exit(0)))
    if not address and os.environ.get("FAKE_WORKER_STANDBY") != "0":
        send({"type": "standby"})
        spare_events = os.environ.get("FAKE_WORKER_SPARE_EVENTS")
        if spare_events:
            with open(spare_events, "a") as f:
                f.write(f"{time.monotonic():.6f} {os.getpid()} standby\n")
    raw = control.recv(65536)
    if not raw:  # the manager stopped the spare (or went away)
        os._exit(0)
    msg = json.loads(raw)
    if msg["type"] == "shutdown":
        os._exit(0)
    assert msg["type"] == "start", msg
    dies = os.environ.get("FAKE_WORKER_SPARE_DIES")
    if not address and dies:
        try:
            os.close(os.open(dies, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os._exit(1)
        except FileExistsError:
            pass
    address = msg["address"]
    data = dict(json.loads(os.environ.get("FAKE_WORKER_START", "{}")))
    data.update(msg.get("start") or {})
    events_path = data.get("events")
    version = (msg.get("code") or {}).get("version")
    mode = data.get("mode", "normal")
    print(f"starting {address}", flush=True)
    print(f"stderr line for {address}", file=sys.stderr, flush=True)
    if mode == "exit_at_start":
        os._exit(3)
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
    if mode == "close_link_before_ready":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        control.close()
        event("link_closed")
        time.sleep(3600)
    if mode == "never_ready":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)
    if mode == "crash_before_ready":
        time.sleep(data.get("crash_after", 50) / 1000)
        os._exit(3)
    threading.Thread(target=serve, args=(data.get("accept_after", 0),), daemon=True).start()
    time.sleep(data.get("slow_ready", 0) / 1000)
    ready = {"type": "ready", "idle": data.get("idle", True), "reload": data.get("reload", True)}
    if data.get("ping"):
        ready["ping"] = True
    ready.update(data.get("counts") or {})
    event("ready")  # before the send, as "started": what the manager does on it comes after
    send(ready)
    ready_sent.set()
    if data.get("daemon"):
        daemonize(data["daemon"])
    if mode == "close_link":
        time.sleep(0.02)
        control.close()
        time.sleep(3600)
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ)
    deadline_idle = time.monotonic() + data["idle_after"] / 1000 if "idle_after" in data else None
    deadline_crash = (time.monotonic() + data.get("crash_after", 50) / 1000
                      if mode == "crash_after_ready" else None)
    reloads = []  # [due, message, action], applied one at a time in arrival order
    while True:
        now = time.monotonic()
        deadline_reload = reloads[0][0] if reloads else None
        waits = [d - now for d in (deadline_idle, deadline_crash, deadline_reload)
                 if d is not None]
        ready = sel.select(max(0, min(waits)) if waits else None)
        now = time.monotonic()
        while reloads and now >= reloads[0][0]:
            _, rm, action = reloads.pop(0)
            apply_reload(rm, action)
            if reloads:  # the next one starts now: its delay counts from here
                reloads[0][0] = now + reloads[0][0]
        if deadline_crash is not None and now >= deadline_crash:
            os._exit(3)
        if deadline_idle is not None and now >= deadline_idle:
            deadline_idle = None
            idle = {"type": "idle", "idle": True}
            if "counts" in data:
                idle.update({"requests": 0, "upgraded": 0, "busy": 0})
            send(idle)
        if not ready:
            continue
        raw = control.recv(65536)
        if not raw:  # the manager went away: exit like the worker library does
            event("exiting")
            os._exit(0)
        m = json.loads(raw)
        if m.get("type") == "ping":
            event(f"ping:{m['id']}")
            pongs = data.get("pongs")
            if pongs is None or pongs > 0:
                if pongs is not None:
                    data["pongs"] = pongs - 1
                send({"type": "pong", "id": m["id"]})
                event(f"pong:{m['id']}")
            continue
        if m.get("type") == "reload":
            event(f"reload_got:{m['id']}")
            delay, action = reload_plan(m, data)
            if reloads:
                reloads.append([delay / 1000, m, action])  # relative until it is the first
            else:
                reloads.append([time.monotonic() + delay / 1000, m, action])
            continue
        if m.get("type") == "shutdown":
            if mode == "ignore_shutdown":
                continue
            time.sleep(data.get("exit_on_shutdown_slowly", 0) / 1000)
            event("exiting")
            print(f"bye from {address}", flush=True)
            os._exit(data.get("shutdown_exit_code", 0))


main()
