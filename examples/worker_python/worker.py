#!/usr/bin/python3
"""A corral worker in Python, standard library only (docs/worker-protocol.md).

Started as a warm spare (no CORRAL_ADDRESS: launched before any request for its address), the
runtime sends `standby` once it waits for `start`, after the optional prepare hook
(WorkerRuntime(setup, redact, prepare)), and learns its address from `start`.

The same counter as examples/worker_cpp/main.cc, one per address:

    GET  /           the count
    POST /inc        adds one, returns the new count
    GET  /start      the start data the manager sent
    GET  /busy?ms=N  holds the worker busy (not idle) for N ms, as background work would
    GET  /slow?ms=N  answers after N ms (a request in flight: not idle meanwhile)
    GET  /crash      aborts (a crash: the address becomes failed)
    GET  /fatal      reports a fatal error whose text holds a secret; only the redacted form crosses
    GET  /headers    the request's header lines as received, a JSON list of [name, value]
    GET  /trace      the request's traceparent (Handler.traceparent)
    POST /count      reads the request body as it streams and answers {"bytes": its length}
    GET  /count/aborted  how many /count bodies this worker saw cut short (the client left)
    GET  /code       {"version": the code version running (null without code), "hello": hello.txt
                     of that version's directory (null if it has none), "pid": the process id}

The count lives in <state dir>/data/<address>.count, the address percent-encoded as in the lock path
("doc%3A42.count": a key can hold any byte, "/" and ".." included): read at setup, written by a
closer at shutdown.

Reload in place (docs/worker-protocol.md, "Code and reload"): the reload hook re-reads hello.txt from
the new set's directory and swaps version and text together, so that one /code answer never mixes
two sets. A new set holding a file named `reload-fails` is refused (the error code `reload_failed`:
the worker keeps its old code); one holding `reload-sleep-ms` (a number) makes the hook take that
long (requests are served meanwhile). With CORRAL_NO_RELOAD=1 no hook is registered (`ready` then
says the worker cannot reload, and a rollout replaces it).

The file has two halves: `WorkerRuntime`, the protocol (copy it into your own worker), and the
counter application at the bottom.

Threads: the main thread owns the control socket (a selectors loop) and every state change of the
lifecycle, and answers the manager's pings (a main thread that is stuck answers none, and the
manager stops the worker as unresponsive); HTTP requests run on threads of a ThreadingHTTPServer; the lock wait runs on a thread of
its own, so `shutdown`, SIGTERM and a lost link are still seen while an old worker holds the lock.
Other threads hand work to the main thread through `post()` (a queue and a wake-up pipe). The reload
hook runs on the main thread, one reload per pass of its loop, while the HTTP threads keep serving
(control messages, a `shutdown` too, wait until the hook returns).
"""

import ctypes
import fcntl
import http.server
import json
import os
import queue
import selectors
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
import base64
import collections
import hashlib
import urllib.parse

FORCE_EXIT_S = 3.0  # the protocol: a worker not gone 3 s after `shutdown` exits by itself
MAX_PACKET = 16 * 1024 * 1024
PR_SET_PDEATHSIG = 1


def log(event, **fields):
    """One line on stderr, which the manager prefixes with the address."""
    text = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in fields.items())
    try:
        sys.stderr.write(f"{event} {text}\n")
        sys.stderr.flush()
    except OSError:
        pass  # the reader is gone (the manager died): the stop path must still run the closers


def decode_address(text):
    """An address's wire form (docs/worker-protocol.md) back to its bytes: '%XX' is the byte XX,
    every other character is its UTF-8. None when a '%' is not followed by two hex digits."""
    out = bytearray()
    i = 0
    raw = text.encode("utf-8", "surrogateescape")
    while i < len(raw):
        c = raw[i]
        if c != 0x25:
            out.append(c)
            i += 1
            continue
        pair = raw[i + 1:i + 3]
        if len(pair) != 2 or not all(chr(b) in "0123456789abcdefABCDEF" for b in pair):
            return None
        out.append(int(pair, 16))
        i += 3
    return bytes(out)


def file_name_for(address_bytes, limit=200):
    """A bounded file name for an address, as the manager names its lock (core/escape.h): the
    percent-encoding of every byte but [A-Za-z0-9._-] while it fits, else a prefix of it, '~' and
    the base64url of the first 128 bits of the address's SHA-256."""
    name = "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-")
                   else f"%{b:02X}" for b in address_bytes)
    if not name or name[0] == ".":
        name = "%" + name
    if len(name) <= limit:
        return name
    keep = limit - 23
    if keep >= 1 and name[keep - 1] == "%":
        keep -= 1
    elif keep >= 2 and name[keep - 2] == "%":
        keep -= 2
    digest = hashlib.sha256(address_bytes).digest()[:16]
    return name[:keep] + "~" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


class PublicError(Exception):
    """What crosses to the manager: message, and optionally a stable code and reason."""

    def __init__(self, message, code=None, reason=None):
        super().__init__(message)
        self.message, self.code, self.reason = message, code, reason

    def to_json(self):
        out = {"message": self.message or "internal error"}
        if self.code:
            out["code"] = self.code
        if self.reason:
            out["reason"] = self.reason
        return out


def default_redact(_exc):
    return PublicError("internal error")


class WorkerRuntime:
    """The child side of the protocol: start, lock, started, ready/idle, reload, fatal, shutdown."""

    def __init__(self, setup, redact=default_redact, prepare=None):
        self.setup = setup  # setup(runtime) -> an http.server handler class; may raise
        self.redact = redact
        # prepare(runtime): runs once before `start` is read, for what does not depend on the
        # address (imports, a shared cache): a warm spare has done it before a request binds it.
        # No address yet (a spare has none); a raise is a `fatal`.
        self.prepare = prepare
        self.control = socket.socket(fileno=int(os.environ["CORRAL_CONTROL_FD"]))
        self.listener = socket.socket(fileno=int(os.environ["CORRAL_LISTEN_FD"]))
        for s in (self.control, self.listener):
            s.set_inheritable(False)
            s.setblocking(True)
        # The address's wire form (printable, safe in JSON and logs); address_bytes is the address.
        self.address = os.environ.get("CORRAL_ADDRESS", "")
        self.address_bytes = decode_address(self.address) or b""
        self.state_dir = os.environ.get("CORRAL_STATE_DIR", "")
        self.start_data = None
        # The code running: `start`'s scripts and code, then each reload's once its hook returned.
        # None (and no scripts) for a kind without code. Replaced, never changed in place.
        self.scripts = []
        self.code_version = None  # hex SHA-256 of the set
        self.code_dir = None  # the snapshot's directory: read-only files, never the live directory
        self.lock_fd = None
        self._locking = False  # a `start` arrived: the lock is being taken (or held)

        self._lock = threading.Lock()  # guards the counts below and the order of sent packets
        self._requests_done = threading.Condition(self._lock)
        self._inflight = 0
        self._busy = 0
        self._reported_idle = True
        self._holds_sent = None  # the counts of the last `ready` or `idle` sent
        self._holds_sent_at = 0.0  # when the last counts report (or busy flip) went out
        self._running = False  # between `ready` and the stop: idle flips are reported
        self._stopping = False
        self._status = 0
        self._closers = []
        self._reload_hook = None
        self._reloads = collections.deque()  # `reload` messages waiting, in arrival order
        self._server = None
        self._posted = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._signal_r, self._signal_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._selector = selectors.DefaultSelector()
        self._done = False

    # --- what the application uses -------------------------------------------------------------

    def on_close(self, closer):
        """Runs at shutdown, in reverse order of registration."""
        self._closers.append(closer)

    def on_reload(self, fn):
        """Registers the reload hook (in setup: `ready` tells the manager whether there is one).

        fn(update) runs on the main thread with the new set, a dict with `version`, `dir` and
        `scripts`; it returns the report (any JSON value; None becomes {}) or raises if the set
        cannot be used: the worker then keeps its old code, and redact(exc) is the answer's error.
        HTTP requests are served meanwhile on their threads; the worker counts as busy."""
        self._reload_hook = fn

    def busy_add(self, delta):
        with self._lock:
            self._busy = max(0, self._busy + delta)
            self._report_idle_locked()

    def fatal(self, exc):
        """Reports redact(exc) as `fatal` (the original goes to stderr only), then stops, status 1."""
        log("worker_fatal", address=self.address, error=str(exc))
        try:
            traceback.print_exception(exc, file=sys.stderr)
        except OSError:
            pass  # stderr's reader is gone
        try:
            public = self.redact(exc)
        except Exception:  # a broken redact must not leak the original either
            public = default_redact(exc)
        error = public.to_json()
        if isinstance(exc, MemoryError) and "code" not in error:
            # An allocation refused (the kind's memory_max as RLIMIT_AS): the manager makes this
            # the address's `memory limit` failure (docs/process-model.md, Containment).
            error["code"] = "memory_limit"
        with self._lock:
            if self._stopping:
                return
            self._send_locked({"type": "fatal", "error": error})
        if threading.current_thread() is threading.main_thread():
            self.stop(1, "fatal")
        else:
            self.post(lambda: self.stop(1, "fatal"))

    def post(self, fn):
        """Runs fn on the main thread (from any thread)."""
        self._posted.put(fn)
        self._wake()

    def _wake(self):
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full, so the main thread will wake anyway

    # --- requests, counted by the handler ------------------------------------------------------

    def request_started(self):
        with self._lock:
            self._inflight += 1
            self._report_idle_locked()

    def request_finished(self):
        with self._lock:
            self._inflight -= 1
            self._report_idle_locked()
            if self._inflight == 0:
                self._requests_done.notify_all()

    # --- the lifecycle, on the main thread -----------------------------------------------------

    def run(self):
        # The manager's death is a SIGTERM; one before this call shows as EOF on the control socket.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass
        signal.set_wakeup_fd(self._signal_w, warn_on_full_buffer=False)
        for signo in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signo, lambda *_: None)  # the byte in the wake-up fd does the work
        self._selector.register(self.control, selectors.EVENT_READ, self._on_control)
        self._selector.register(self._wake_r, selectors.EVENT_READ, self._on_posted)
        self._selector.register(self._signal_r, selectors.EVENT_READ, self._on_signal)
        self._prepare()
        while not self._done:
            # One reload per pass, so that the control messages between two are seen.
            timeout = 0 if self._reload_due() else self._holds_report_due()
            for key, _ in self._selector.select(timeout):
                key.data()
                if self._done:
                    break
            if not self._done:
                self._report_holds()
            if not self._done and self._reload_due():
                self._apply_next_reload()
        log("worker_exit", address=self.address, status=self._status)
        return self._status

    def _prepare(self):
        """The application's prepare hook, then `standby` as a warm spare (launched without an
        address, docs/worker-protocol.md "Warm spares"): it waits for `start` from now on."""
        if self.prepare is not None:
            try:
                self.prepare(self)
            except Exception as e:  # noqa: BLE001 - a prepare failure is a `fatal`
                self.fatal(e)
                return
        if not self.address:
            with self._lock:
                self._send_locked({"type": "standby"})

    def _on_signal(self):
        data = os.read(self._signal_r, 64)
        if data:
            self.stop(0, "sigint" if data[-1] == signal.SIGINT else "sigterm")

    # While not idle, the counts go out at most once a second when they changed since the last
    # report (from this loop, not per request: a busy worker's requests cost no message each).
    HOLDS_REPORT_S = 1.0

    def _holds_report_due(self):
        """Seconds until the next counts report may go out; None while idle (no report due)."""
        with self._lock:
            if not self._running or self._reported_idle:
                return None
            return max(0.0, self._holds_sent_at + self.HOLDS_REPORT_S - time.monotonic())

    def _report_holds(self):
        with self._lock:
            if not self._running or self._reported_idle:
                return
            if time.monotonic() < self._holds_sent_at + self.HOLDS_REPORT_S:
                return
            holds = self._holds_locked()
            if holds != self._holds_sent:
                self._send_locked({"type": "idle", "idle": False, **holds})
            self._holds_sent_at = time.monotonic()

    def _on_posted(self):
        os.read(self._wake_r, 4096)
        while True:
            try:
                fn = self._posted.get_nowait()
            except queue.Empty:
                return
            fn()

    def _on_control(self):
        try:
            size = self.control.recv_into(bytearray(1), 1, socket.MSG_PEEK | socket.MSG_TRUNC)
            if size == 0:  # EOF (the manager never sends an empty packet)
                return self._lost()
            packet = self.control.recv(size)
        except OSError as e:
            log("control_link_error", error=str(e))
            return self._lost()
        if not packet:
            return self._lost()
        if size > MAX_PACKET:
            return log("control_message_dropped", reason="too large", bytes=size)
        try:
            msg = json.loads(packet)
            kind = msg["type"]
            if not isinstance(kind, str):
                raise TypeError("type is not a string")
        except (ValueError, TypeError, KeyError) as e:
            return log("control_message_dropped", reason=f"invalid: {e}")
        if kind == "ping":
            # Answered on the main thread, which runs the lifecycle: if it is stuck (a reload
            # hook that never returns, a deadlock), no pong goes out and the manager stops the
            # worker as unresponsive (issue 14).
            rid = msg.get("id")
            if isinstance(rid, int) and not isinstance(rid, bool) and rid >= 0:
                with self._lock:
                    self._send_locked({"type": "pong", "id": rid})
            else:
                log("control_message_dropped", reason="ping without an id")
        elif kind == "shutdown":
            self.stop(0, "shutdown")
        elif kind == "start":
            self._on_start(msg)
        elif kind == "reload":
            self._on_reload(msg)
        # Unknown types are ignored (forward compatibility).

    def _lost(self):
        self._selector.unregister(self.control)
        self.stop(0, "control_link_lost")

    def _on_start(self, msg):
        if self._locking:
            return log("control_message_dropped", reason="a second start")
        lock = msg.get("lock")
        if not isinstance(lock, str) or not lock:
            return log("control_message_dropped", reason="start without a lock path")
        address = msg.get("address")
        if isinstance(address, str) and address and decode_address(address) is not None:
            self.address, self.address_bytes = address, decode_address(address)
        self.start_data = msg.get("start")
        code = _parse_code(msg, required=False)
        if code is None:
            return log("control_message_dropped", reason="start with a malformed scripts or code")
        scripts, self.code_version, self.code_dir, manifest = code
        try:
            self.scripts = _load_manifest(manifest, self.code_version) if manifest else scripts
        except (OSError, ValueError) as e:
            log("code_manifest_failed", address=self.address, error=str(e))
            with self._lock:
                self._send_locked({"type": "fatal", "error": PublicError(
                    "the worker could not read its code set", "code_manifest_failed").to_json()})
            return self.stop(1, "code_manifest_failed")
        self._locking = True
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            return self._lock_failed(lock, e)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return self._locked(fd)
        except BlockingIOError:
            pass
        except OSError as e:
            os.close(fd)
            return self._lock_failed(lock, e)
        # An old worker for this address still lives: wait for its exit, blocking, not polling.
        log("lock_wait", address=self.address, lock=lock)

        def wait():
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                self.post(lambda: self._lock_failed(lock, e))
                return
            self.post(lambda: self._locked(fd))

        threading.Thread(target=wait, name="lock-wait", daemon=True).start()

    def _on_reload(self, msg):
        if self._stopping:
            return  # a reload during a stop is ignored: the manager settles it by the exit
        rid = msg.get("id")
        code = _parse_code(msg, required=True)
        if isinstance(rid, bool) or not isinstance(rid, int) or rid <= 0 or code is None:
            return log("control_message_dropped", reason="reload without an id or a code")
        # Applied by the main loop once `ready` was sent (before that it waits here).
        self._reloads.append((rid, code))

    def _reload_due(self):
        return bool(self._reloads) and self._running and not self._stopping

    def _apply_next_reload(self):
        rid, (scripts, version, directory, manifest) = self._reloads.popleft()
        if manifest:
            try:
                scripts = _load_manifest(manifest, version)
            except (OSError, ValueError) as e:
                log("worker_reload_failed", address=self.address, id=rid, version=version,
                    error=str(e))
                with self._lock:
                    self._send_locked({"type": "reloaded", "id": rid, "version": version,
                                       "error": PublicError("The new code set could not be read.",
                                                            "code_manifest_failed").to_json()})
                return
        if self._reload_hook is None:
            log("worker_reload_failed", address=self.address, id=rid, error="no reload hook")
            with self._lock:
                self._send_locked({"type": "reloaded", "id": rid, "version": version,
                                   "error": PublicError("This worker cannot reload in place.",
                                                        "no_reload").to_json()})
            return
        self.busy_add(1)  # `idle: false` goes out before the hook runs
        reply = {"type": "reloaded", "id": rid, "version": version}
        try:
            report = self._reload_hook({"version": version, "dir": directory, "scripts": scripts})
            reply["report"] = {} if report is None else report
            json.dumps(reply["report"])  # a report that cannot cross is the hook's failure
            ok = True
        except Exception as e:  # noqa: BLE001 - every hook failure is a `reloaded` error
            log("worker_reload_failed", address=self.address, id=rid, version=version,
                error=str(e))
            try:
                traceback.print_exception(e, file=sys.stderr)
            except OSError:
                pass
            try:
                public = self.redact(e)
            except Exception:  # a broken redact must not leak the original either
                public = default_redact(e)
            reply.pop("report", None)
            reply["error"] = public.to_json()
            ok = False
        if self._stopping:
            return  # the hook called fatal(): nothing more is answered
        if ok:
            self.scripts, self.code_version, self.code_dir = scripts, version, directory
            log("worker_reloaded", address=self.address, id=rid, version=version)
        with self._lock:
            self._send_locked(reply)
        self.busy_add(-1)  # after `reloaded`: an idle flip the manager sees follows the reply

    def _lock_failed(self, path, error):
        log("lock_failed", address=self.address, lock=path, error=str(error))
        with self._lock:
            if self._stopping:
                return
            self._send_locked({"type": "fatal", "error": PublicError(
                "the worker could not take its address lock", "lock_failed").to_json()})
        self.stop(1, "lock_failed")

    def _locked(self, fd):
        if self._stopping:
            os.close(fd)
            return
        self.lock_fd = fd  # held (close-on-exec) until the process exits, after the closers
        with self._lock:
            self._send_locked({"type": "started"})
        try:
            handler = self.setup(self)
            server = _Server(self.listener, handler)
        except Exception as e:  # noqa: BLE001 - every setup failure is a `fatal`
            self.fatal(e)
            return
        if self._stopping:
            return
        self._server = server
        threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
        with self._lock:
            self._running = True
            self._reported_idle = self._idle_locked()
            ready = {"type": "ready", "idle": self._reported_idle, "ping": True,
                     **self._holds_locked()}
            if self._reload_hook is not None:
                ready["reload"] = True
            self._send_locked(ready)
        log("worker_ready", address=self.address, reload=self._reload_hook is not None)

    def stop(self, status, why):
        """Every way out: stop accepting, let requests finish, run the closers, exit."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._running = False
        self._reloads.clear()
        self._status = status
        log("worker_stopping", address=self.address, reason=why)
        force = threading.Timer(FORCE_EXIT_S, self._force_exit, args=(status,))
        force.daemon = True
        force.start()
        if self._server is not None:
            self._server.shutdown()  # serve_forever returns; no more accepts
            self._server.server_close()
            with self._requests_done:  # running requests get half the force-exit time
                self._requests_done.wait_for(lambda: self._inflight == 0, FORCE_EXIT_S / 2)
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception as e:  # noqa: BLE001 - the other closers still run
                log("closer_failed", address=self.address, error=str(e))
        self._closers.clear()
        self._done = True

    @staticmethod
    def _force_exit(status):
        sys.stderr.write("worker force_exit: the stop took longer than 3 s\n")
        sys.stderr.flush()
        os._exit(status)

    # --- under self._lock ----------------------------------------------------------------------

    def _idle_locked(self):
        return self._inflight == 0 and self._busy == 0

    def _holds_locked(self):
        """What holds the worker (issue 14): this library relays no upgraded connections."""
        return {"requests": self._inflight, "upgraded": 0, "busy": self._busy}

    def _report_idle_locked(self):
        if not self._running:
            return
        idle = self._idle_locked()
        if idle != self._reported_idle:
            self._reported_idle = idle
            self._send_locked({"type": "idle", "idle": idle, **self._holds_locked()})
            if not idle:
                # The main thread may sleep in select() with no timeout: wake it, so that it
                # reports the counts while the worker stays busy (once per flip, not per request).
                self._holds_sent_at = time.monotonic()
                self._wake()

    def _send_locked(self, msg):
        if msg.get("type") in ("ready", "idle"):
            self._holds_sent = {k: msg[k] for k in ("requests", "upgraded", "busy")}
        try:
            self.control.send(json.dumps(msg).encode())
        except OSError as e:
            log("control_link_error", error=str(e))  # the main thread sees EOF and stops


def _parse_code(msg, required):
    """(scripts, version, dir, manifest) of a `start` or `reload`; None when malformed. Without
    `code` (a kind without code; refused when `required`): (scripts, None, None, None). The set's
    files come by reference (`code.manifest`, read by _load_manifest) or inline (`scripts`)."""
    scripts = msg.get("scripts")
    if scripts is None:
        scripts = []
    if not isinstance(scripts, list):
        return None
    code = msg.get("code")
    if code is None:
        return None if required else (scripts, None, None, None)
    if not isinstance(code, dict) or not isinstance(code.get("version"), str):
        return None
    directory, manifest = code.get("dir"), code.get("manifest")
    for value in (directory, manifest):
        if value is not None and not isinstance(value, str):
            return None
    return scripts, code["version"], directory, manifest


def _load_manifest(path, version):
    """The `files` of a snapshot's manifest ({version, files: [{path, digest}]}), the set's
    `scripts`; ValueError when it is not the manifest of `version`, OSError when unreadable."""
    with open(path, "rb") as f:
        m = json.loads(f.read())
    if not isinstance(m, dict) or m.get("version") != version:
        raise ValueError(f"{path}: not the manifest of version {version}")
    files = m.get("files")
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("path"), str) for f in files):
        raise ValueError(f"{path}: no list of files")
    return files


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """An HTTP server on the listening socket the manager made (fd 4): no bind, no listen."""

    address_family = socket.AF_UNIX
    daemon_threads = True

    def __init__(self, sock, handler):
        super().__init__(None, handler, bind_and_activate=False)
        self.socket.close()  # the unbound one TCPServer made
        self.socket = sock
        # The manager listens with a backlog of 128: as deep as the system allows, so that a burst
        # of connections waits in the queue instead of finding it full.
        sock.listen(socket.SOMAXCONN)
        self.server_address = sock.getsockname()
        self.runtime = handler.runtime

    # A connection counts as a request in flight from its accept until its first request is read
    # (Handler.dispatch): the proxy sent it for a request, so the worker is not idle, and a stop
    # waits for it, from the accept on, not from the moment a busy machine gets to parse it.
    def process_request(self, request, client_address):  # the accepting thread
        self.runtime.request_started()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.runtime.request_finished()
            raise

    def finish_request(self, request, client_address):  # the connection's own thread
        _connection.unread = True
        try:
            super().finish_request(request, client_address)
        finally:
            _first_request_read(self.runtime)


_connection = threading.local()  # per connection thread: `unread` until its first request


def _first_request_read(runtime):
    if getattr(_connection, "unread", False):
        _connection.unread = False
        runtime.request_finished()


class Handler(http.server.BaseHTTPRequestHandler):
    """Base for the application's handler: keep-alive, quiet logs, requests counted for `idle`."""

    protocol_version = "HTTP/1.1"
    runtime = None  # set by the application's setup

    def address_string(self):
        return "proxy"  # a Unix socket peer has no address; the proxy sends Corral-Remote-Address

    @property
    def traceparent(self):
        """This request's W3C traceparent as the proxy sent it (the client's when valid, else one
        corral made; the access log carries the same value), beside `command`, `path` and
        `headers`. None when the request had none (a worker reached without corral in front)."""
        headers = getattr(self, "headers", None)  # unset when the request line was bad
        return headers.get("traceparent") if headers is not None else None

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # the proxy in front logs requests

    def send_response(self, code, message=None):
        # The proxy's sequence number of a pipelined request goes back with its answer, so that
        # the proxy knows the answer is this request's (docs/worker-protocol.md, "Pipelining").
        super().send_response(code, message)
        headers = getattr(self, "headers", None)  # unset when the request line was bad
        seq = headers.get("Corral-Seq") if headers is not None else None
        if seq is not None:
            self.send_header("Corral-Seq", seq)

    def reply(self, status, body, content_type="text/plain; charset=utf-8"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def body_pieces(self, size=1 << 16):
        """The request body as it comes, in pieces of at most `size` bytes: Content-Length, or
        chunked (the proxy re-chunks a client's chunked body; trailers are dropped). Raises
        ConnectionError when the body ends early (the client left: the proxy closed the
        connection)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(4096)
                if not line.endswith(b"\n"):
                    raise ConnectionError("body cut inside a chunk size")
                n = int(line.split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(4096) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                while n:
                    piece = self.rfile.read(min(n, size))
                    if not piece:
                        raise ConnectionError("body cut inside a chunk")
                    n -= len(piece)
                    yield piece
                self.rfile.readline(4096)  # the chunk's CRLF
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            piece = self.rfile.read(min(left, size))
            if not piece:
                raise ConnectionError("body cut")
            left -= len(piece)
            yield piece

    def dispatch(self, routes, streamed=()):
        path, _, query = self.path.partition("?")
        route = routes.get((self.command, path))
        self.runtime.request_started()
        _first_request_read(self.runtime)  # after: no idle flip in between
        try:
            # A streamed route reads body_pieces() itself; the others get the body whole.
            if (self.command, path) in streamed:
                self.body = None
            else:
                self.body = b"".join(self.body_pieces())
            if route is None:
                self.reply(404, "not found\n")
            else:
                route(self, urllib.parse.parse_qs(query))
        except ConnectionError as e:  # the body was cut: nobody to answer
            log("request_cut", path=path, error=str(e))
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a throwing route is a generic 500
            log("route_failed", path=path, error=str(e))
            self.reply(500, "internal error\n")
        finally:
            self.runtime.request_finished()


# ------------------------------------------------------------------------------------------------
# The application: a counter per address.


def setup(runtime):
    data_dir = os.path.join(runtime.state_dir or ".", "data")
    os.makedirs(data_dir, mode=0o700, exist_ok=True)
    path = os.path.join(data_dir, file_name_for(runtime.address_bytes) + ".count")
    state = {"count": 0}
    try:
        with open(path) as f:
            state["count"] = int(f.read().strip() or 0)
    except FileNotFoundError:
        pass

    def save():
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{state['count']}\n")
        os.replace(tmp, path)

    runtime.on_close(save)
    count_lock = threading.Lock()

    def get_count(h, _q):
        h.reply(200, f"{state['count']}\n")

    def inc(h, _q):
        with count_lock:
            state["count"] += 1
            n = state["count"]
        h.reply(200, f"{n}\n")

    def start(h, _q):
        h.reply(200, json.dumps({"address": runtime.address, "start": runtime.start_data,
                                 "scripts": runtime.scripts}), "application/json")

    def busy(h, q):
        ms = min(int((q.get("ms") or ["0"])[0]), 60_000)
        runtime.busy_add(1)
        t = threading.Timer(ms / 1000, runtime.busy_add, args=(-1,))
        t.daemon = True
        t.start()
        h.reply(200, f"busy {ms} ms\n")

    def slow(h, q):
        ms = min(int((q.get("ms") or ["0"])[0]), 60_000)
        time.sleep(ms / 1000)  # this request's own thread; it counts as in flight meanwhile
        h.reply(200, f"slow {ms} ms\n")

    def crash(_h, _q):
        os.abort()

    def fatal(h, _q):
        runtime.fatal(RuntimeError("database refused password secret-123"))
        h.reply(500, "fatal\n")

    def headers(h, _q):
        h.reply(200, json.dumps([[k, v] for k, v in h.headers.items()]), "application/json")

    def trace(h, _q):
        h.reply(200, f"{h.traceparent}\n")

    # (version, hello) of the set running: one tuple, replaced whole by the reload hook, so that an
    # answer read on a request thread never mixes two sets.
    code = [(runtime.code_version, read_code_file(runtime.code_dir, "hello.txt"))]

    def reload(update):
        sleep_ms = read_code_file(update["dir"], "reload-sleep-ms")
        if sleep_ms is not None:
            time.sleep(min(int(sleep_ms.strip() or 0), 60_000) / 1000)
        if read_code_file(update["dir"], "reload-fails") is not None:
            raise ReloadFailed(f"the set {update['version']} has a file named reload-fails")
        hello = read_code_file(update["dir"], "hello.txt")
        code[0] = (update["version"], hello)
        return {"hello": hello}

    if os.environ.get("CORRAL_NO_RELOAD") != "1":
        runtime.on_reload(reload)

    def get_code(h, _q):
        version, hello = code[0]
        h.reply(200, json.dumps({"version": version, "hello": hello, "pid": os.getpid()}),
                "application/json")

    uploads = {"aborted": 0}

    def count_upload(h, _q):
        n = 0
        try:
            for piece in h.body_pieces():
                n += len(piece)
        except ConnectionError:
            with count_lock:
                uploads["aborted"] += 1
            raise
        h.reply(200, json.dumps({"bytes": n}), "application/json")

    def count_aborted(h, _q):
        h.reply(200, f"{uploads['aborted']}\n")

    routes = {
        ("GET", "/"): get_count,
        ("POST", "/count"): count_upload,
        ("GET", "/count/aborted"): count_aborted,
        ("GET", "/headers"): headers,
        ("GET", "/trace"): trace,
        ("POST", "/inc"): inc,
        ("GET", "/start"): start,
        ("GET", "/busy"): busy,
        ("GET", "/slow"): slow,
        ("GET", "/crash"): crash,
        ("GET", "/fatal"): fatal,
        ("GET", "/code"): get_code,
    }

    class Counter(Handler):
        def do_GET(self):
            self.dispatch(routes)

        def do_POST(self):
            self.dispatch(routes, streamed={("POST", "/count")})

    Counter.runtime = runtime
    return Counter


class ReloadFailed(Exception):
    """The reload hook's refusal of a set (its own error code, below)."""


def read_code_file(directory, name):
    """The text of directory/name; None without a directory (a kind without code) or file."""
    if not directory:
        return None
    try:
        with open(os.path.join(directory, name), "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def redact(exc):
    if isinstance(exc, ReloadFailed):
        return PublicError("the new code cannot be loaded", "reload_failed")
    return PublicError("the counter failed", "counter_failed")


if __name__ == "__main__":
    if "CORRAL_CONTROL_FD" not in os.environ or "CORRAL_LISTEN_FD" not in os.environ:
        sys.stderr.write("not started by a worker manager: CORRAL_CONTROL_FD/CORRAL_LISTEN_FD unset\n")
        sys.exit(78)
    sys.exit(WorkerRuntime(setup, redact).run())
