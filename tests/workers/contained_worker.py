#!/usr/bin/python3
"""A worker for tests/e2e/test_worker_containment.py: speaks docs/worker-protocol.md (fd 3 control
link, fd 4 listening socket, the flock lock) and answers every HTTP request with 200 "ok <address>",
after doing what CONTAINED_MODE (its kind's `env`) says. Standard library only.

  hog:   each request allocates 1 MiB blocks until an allocation fails (MemoryError: under corral's
         rlimits the kind's memory_max is RLIMIT_AS), prints how far it got to stderr, reports
         `fatal` with code "memory_limit" (what a worker library does when an allocation fails,
         docs/process-model.md "Containment") and exits 1.
  forks: each request switches the worker to the uid CONTAINED_UID (when it runs as root: a
         worker that drops root, as under `setpriv --reuid`), then forks up to CONTAINED_FORKS
         (100) children that wait on a pipe, and answers {"uid", "forked", "refused", "errno"}:
         how many forks succeeded and how many failed (EAGAIN under a task limit); the children
         are ended and reaped before the answer.
  Either way it exits at once on `shutdown` (or the control link's end).

  flood: after `ready`, writes CONTAINED_FLOOD_MB MiB of 1000-byte lines to stdout as fast as the
         pipe takes them, then one CONTAINED_LONG_KB KiB line with no newline, then "flood done\n";
         it serves meanwhile.
"""
import fcntl
import json
import os
import socket
import sys
import threading

address = os.environ["CORRAL_ADDRESS"]
control = socket.socket(fileno=int(os.environ["CORRAL_CONTROL_FD"]))
listener = socket.socket(fileno=int(os.environ["CORRAL_LISTEN_FD"]))
mode = os.environ.get("CONTAINED_MODE", "")


def send(msg):
    control.send(json.dumps(msg).encode())


def read_request(conn):
    conn.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        b = conn.recv(65536)
        if not b:
            return
        head += b


def hog():
    blocks = []
    try:
        while True:
            blocks.append(bytearray(1 << 20))
    except MemoryError:
        got = len(blocks)
        blocks = None
        print(f"MemoryError after {got} MiB", file=sys.stderr, flush=True)
        send({"type": "fatal", "error": {"message": "out of memory", "code": "memory_limit"}})
        os._exit(1)


def flood():
    out = sys.stdout.buffer
    line = b"x" * 999 + b"\n"
    chunk = line * 64
    for _ in range(int(os.environ.get("CONTAINED_FLOOD_MB", "20")) * 1024 // 64):
        out.write(chunk)
    out.write(b"y" * (int(os.environ.get("CONTAINED_LONG_KB", "1024")) * 1024))
    out.write(b"\nflood done\n")
    out.flush()


def forks():
    uid = int(os.environ.get("CONTAINED_UID", "0"))
    if os.getuid() == 0 and uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    r, w = os.pipe()
    kids, refused, err = [], 0, 0
    for _ in range(int(os.environ.get("CONTAINED_FORKS", "100"))):
        try:
            pid = os.fork()
        except OSError as e:
            refused += 1
            err = e.errno
            continue
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        kids.append(pid)
    os.close(w)
    os.close(r)
    for pid in kids:
        os.waitpid(pid, 0)
    return json.dumps({"uid": os.getuid(), "forked": len(kids), "refused": refused,
                       "errno": err}) + "\n"


def follow_control():
    # `shutdown`, or the link's end: there is nothing to close, go at once.
    while True:
        try:
            data = control.recv(65536)
        except OSError:
            data = b""
        if not data or json.loads(data).get("type") == "shutdown":
            os._exit(0)


def main():
    msg = json.loads(control.recv(65536))
    assert msg["type"] == "start", msg
    lock = os.open(msg["lock"], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    send({"type": "started"})
    send({"type": "ready", "idle": True})
    threading.Thread(target=follow_control, daemon=True).start()
    if mode == "flood":
        threading.Thread(target=flood, daemon=True).start()
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                read_request(conn)
                if mode == "hog":
                    hog()
                body = (forks() if mode == "forks" else f"ok {address}\n").encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
            except OSError:
                pass


main()
