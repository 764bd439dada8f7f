// corral-worker: the child side of corral's worker protocol (docs/worker-protocol.md) for Node.js,
// the twin of the C++ library (src/worker/worker.h) and of the Python runtime
// (examples/worker_python/worker.py). One ES module, Node 18 or newer, node: builtins only.
//
//   import { workerMain, PublicError } from "./corral-worker.mjs";
//   workerMain(async (runtime) => (req, res) => res.end("hi\n"), { redact });
//
// What workerMain does, in order:
//   1. opens CORRAL_CONTROL_FD (3) and CORRAL_LISTEN_FD (4); watches the parent (below); awaits
//      the application's prepare hook (options.prepare(runtime): what does not depend on the
//      address; a throw is a `fatal`) and, as a warm spare (no CORRAL_ADDRESS: launched before
//      any request, docs/worker-protocol.md "Warm spares"), sends `standby`;
//   2. waits for `start`, takes the address's lock (blocking, without blocking the event loop, so
//      `shutdown`, SIGTERM and a lost link are still seen meanwhile), then sends `started`;
//   3. awaits setup(runtime), which returns the request listener `(req, res)` or
//      `{ request, upgrade }` (a throw or a rejection is a `fatal`: redacted error, exit 1);
//   4. serves HTTP/1.1 on fd 4, sends `ready {idle, reload?, ping, requests, upgraded, busy}`,
//      then `idle {idle, requests, upgraded, busy}` on every flip of (no request in flight, no
//      upgraded connection, busy count zero), and while not idle at most once a second when a
//      count changed (what holds the worker, issue 14); a connection counts as a request in
//      flight from its accept until its first request is read;
//   4b. answers each `ping {id}` with `pong {id}` from the event loop: a loop that is stuck (a
//      handler that never yields) answers none, and the manager stops the worker as unresponsive;
//   5. applies `reload` messages one at a time through the hook of runtime.onReload (busy while it
//      runs), answering `reloaded` with its report or its redacted error;
//   6. stops on `shutdown`, SIGTERM/SIGINT, parent death or a lost control link: stops accepting,
//      lets running requests finish for at most half of forceExitMs, awaits the closers in reverse
//      order of registration, and exits 0 (1 after a fatal). A stop that takes longer than
//      forceExitMs (3 s, the protocol's bound) ends in process.exit(status) from a timer or, if
//      the event loop itself is stuck (a closer that never yields), in a SIGKILL from a watchdog
//      process 250 ms later.
//
// Three things Node does not offer, and how this file gets them from builtins:
//
// * SOCK_SEQPACKET. libuv's handle-type guess calls it UNKNOWN, so net.Socket({fd: 3}) throws. The
//   socket is opened as a libuv pipe (process.binding("pipe_wrap"): uv_pipe_open does not check
//   the socket type) and read through net.Socket's `onread` option with one 16 MiB + 1 buffer:
//   every read(2) of a SEQPACKET socket returns exactly one packet, so each callback is one
//   message, also when several arrive together, and a packet that fills the whole buffer was cut
//   (dropped as too large). Writes go one at a time (the next after the previous one's callback):
//   Node's stream would otherwise writev two queued messages into one packet. (A blocking fs.read
//   on a thread-pool thread also keeps boundaries, but process.exit then hangs: libuv joins its
//   pool threads at exit, and one is stuck in read(2).)
// * flock(2). The lock file is opened here (fs.openSync, close-on-exec) and the same open file
//   description is handed to `flock -x 3` (util-linux, Essential on Debian) as its fd 3: flock(1)
//   blocks until the lock is granted, then exits, and the lock stays with the open file
//   description, which this process alone now holds. So the lock is this process's own: its death
//   (also kill -9) releases it, nothing is left to poll, and `started` is sent only after flock(1)
//   exited 0. The helper's fd 4 is /dev/null, so it never holds the listening socket.
// * PR_SET_PDEATHSIG. The manager's death closes its end of the control socket (EOF, a lost link);
//   process.ppid is also checked every second, for a parent that dies while the link lives on in
//   another process.
//
// Limits: Node cannot set FD_CLOEXEC on inherited descriptors, so fds 3 and 4 reach children the
// application spawns, unless it passes `stdio` for them. An empty packet reads as EOF (the manager
// never sends one). The thread pool is not used.
//
// Lifetime and threading: one workerMain per process; its runtime lives until the process exits
// (the lock descriptor with it, so a successor starts only after the closers ran). Everything runs
// on the main thread's event loop; the lock helper lives during the lock wait, the watchdog
// process during a stop.

import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";

export const FORCE_EXIT_MS = 3000; // the protocol: a worker not gone 3 s after `shutdown` exits
export const MAX_PACKET = 16 * 1024 * 1024; // a `start` or `reload` with inline scripts (older managers)
export const MAX_SEND = 64 * 1024; // the manager reads packets of up to 64 KiB
export const EXIT_OK = 0;
export const EXIT_FATAL = 1; // fatal(), a throwing setup, the lock not taken
export const EXIT_BAD_ENVIRONMENT = 78; // EX_CONFIG: not started by a worker manager
const FINAL_FLUSH_MS = 1000; // the last messages (a `fatal`) before the exit, as the C++ library
const LOCK_WAIT_LOG_MS = 100;
const WATCHDOG_EXTRA_MS = 250; // after forceExitMs, a stop whose loop is stuck is killed // a lock not granted by then is logged as `lock_wait`
const FLOCK = "flock";
const HOLDS_REPORT_MS = 1000; // while not idle, changed counts are reported at most this often

// --- the sans-IO pieces (unit-tested in corral-worker.test.mjs) -------------------------------

/** What crosses to the manager: a message, and optionally a stable code and reason. */
export class PublicError extends Error {
  constructor(message, code, reason) {
    super(message);
    this.name = "PublicError";
    this.code = code;
    this.reason = reason;
  }
}

export function defaultRedact(_err) {
  return new PublicError("internal error");
}

/** The `{message, code?, reason?}` of what a redact hook returned (a PublicError or a plain
 * object); only strings cross. */
export function publicJson(pub) {
  const out = { message: "internal error" };
  if (pub && typeof pub === "object") {
    if (typeof pub.message === "string" && pub.message) out.message = pub.message;
    if (typeof pub.code === "string" && pub.code) out.code = pub.code;
    if (typeof pub.reason === "string" && pub.reason) out.reason = pub.reason;
  }
  return out;
}

/** An address's wire form back to its bytes (docs/worker-protocol.md): `%XX` is the byte XX, every
 * other character its UTF-8. null when a `%` is not followed by two hex digits. */
export function decodeAddress(text) {
  const raw = Buffer.from(String(text), "utf8");
  const out = Buffer.allocUnsafe(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; ) {
    const c = raw[i];
    if (c !== 0x25) {
      out[n++] = c;
      i += 1;
      continue;
    }
    const pair = raw.toString("latin1", i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(pair)) return null;
    out[n++] = parseInt(pair, 16);
    i += 3;
  }
  return Buffer.from(out.subarray(0, n));
}

const NAME_SAFE = /[A-Za-z0-9._-]/;

/** A bounded file name for an address's bytes, as the manager names its lock (core/escape.h):
 * every byte but [A-Za-z0-9._-] as %XX while it fits `limit`, else a prefix of that, `~` and the
 * base64url of the first 128 bits of the SHA-256 of the bytes. */
export function fileNameFor(bytes, limit = 200) {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes);
  let name = "";
  for (const b of buf) {
    const ch = String.fromCharCode(b);
    name += b < 0x80 && NAME_SAFE.test(ch) ? ch : "%" + b.toString(16).toUpperCase().padStart(2, "0");
  }
  if (name === "" || name[0] === ".") name = "%" + name; // never "", "." nor ".."
  limit = Math.max(limit, 23);
  if (name.length <= limit) return name;
  let keep = limit - 23;
  if (keep >= 1 && name[keep - 1] === "%") keep -= 1;
  else if (keep >= 2 && name[keep - 2] === "%") keep -= 2;
  const digest = createHash("sha256").update(buf).digest().subarray(0, 16);
  return name.slice(0, keep) + "~" + digest.toString("base64url");
}

/** One packet read from the control socket (n bytes of buf, whose capacity is buf.length) as
 * `{message}` or `{drop: reason}`. A packet that filled the whole buffer was cut by the kernel. */
export function parseManagerPacket(buf, n, capacity = buf.length) {
  if (n >= capacity) return { drop: "too large", bytes: n };
  let msg;
  try {
    msg = JSON.parse(buf.toString("utf8", 0, n));
  } catch (e) {
    return { drop: `invalid: ${e.message}` };
  }
  if (msg === null || typeof msg !== "object" || Array.isArray(msg)) return { drop: "invalid: not an object" };
  if (typeof msg.type !== "string") return { drop: "invalid: no type" };
  return { message: msg };
}

/** The `{version, dir, scripts}` of a `start` or `reload` message. The set's files come by
 * reference: `code.manifest` names the snapshot's manifest ({version, files}), read here (throws
 * when it cannot be read or is not the set's); or inline as `scripts` (older managers). */
export function codeSetOf(msg) {
  const code = msg && typeof msg.code === "object" && msg.code !== null ? msg.code : {};
  const set = {
    version: typeof code.version === "string" ? code.version : null,
    dir: typeof code.dir === "string" ? code.dir : null,
    scripts: Array.isArray(msg && msg.scripts) ? msg.scripts : [],
  };
  if (typeof code.manifest === "string" && code.manifest) {
    const m = JSON.parse(fs.readFileSync(code.manifest, "utf8"));
    if (m === null || typeof m !== "object" || m.version !== set.version) {
      throw new Error(`${code.manifest}: not the manifest of version ${set.version}`);
    }
    if (!Array.isArray(m.files) || !m.files.every((f) => f && typeof f.path === "string")) {
      throw new Error(`${code.manifest}: no list of files`);
    }
    set.scripts = m.files;
  }
  return set;
}

/** One line on stderr, which the manager prefixes with the address. */
export function log(event, fields = {}) {
  const text = Object.entries(fields)
    .map(([k, v]) => `${k}=${typeof v === "string" ? JSON.stringify(v) : v}`)
    .join(" ");
  try {
    process.stderr.write(text ? `${event} ${text}\n` : `${event}\n`);
  } catch {
    // the reader is gone (the manager died): the stop path must still run the closers
  }
}

// --- the control link ------------------------------------------------------------------------

/** The SOCK_SEQPACKET socket on `fd`: one JSON message per packet, both ways. Exported for the
 * tests; `capacity` (the largest packet read whole) is MAX_PACKET but there. */
export class ControlLink {
  constructor(fd, { onMessage, onLost, onTooLarge = () => {}, capacity = MAX_PACKET }) {
    const { Pipe, constants } = process.binding("pipe_wrap");
    const handle = new Pipe(constants.SOCKET);
    const err = handle.open(fd);
    if (err) throw new Error(`fd ${fd} cannot be opened as a socket (uv error ${err})`);
    this.onMessage = onMessage;
    this.onLost = onLost;
    this.onTooLarge = onTooLarge;
    this.queue = [];
    this.writing = false;
    this.lost = false;
    this.drained = [];
    const buffer = Buffer.allocUnsafeSlow(capacity + 1); // pages are touched only as packets fill them
    this.socket = new net.Socket({
      handle,
      onread: { buffer, callback: (n, buf) => this.onPacket(n, buf) },
    });
    this.socket.on("end", () => this.lose());
    this.socket.on("error", (e) => {
      log("control_link_error", { error: e.message });
      this.lose();
    });
  }

  onPacket(n, buf) {
    if (n <= 0) return; // EOF arrives as "end"
    const r = parseManagerPacket(buf, n);
    if (r.drop) {
      log("control_message_dropped", r.bytes === undefined ? { reason: r.drop } : { reason: r.drop, bytes: r.bytes });
      if (r.drop === "too large") this.onTooLarge();
      return;
    }
    this.onMessage(r.message);
  }

  /** Queues msg; false when it cannot be sent (too large for the manager, or the link is gone). */
  send(msg) {
    if (this.lost) return false;
    const data = Buffer.from(JSON.stringify(msg), "utf8");
    if (data.length > MAX_SEND) {
      log("control_message_dropped", { reason: "too large", bytes: data.length, type: msg.type });
      return false;
    }
    this.queue.push(data);
    this.pump();
    return true;
  }

  pump() {
    if (this.writing || this.lost) return;
    const data = this.queue.shift();
    if (!data) {
      for (const resolve of this.drained.splice(0)) resolve();
      return;
    }
    this.writing = true;
    this.socket.write(data, (err) => {
      this.writing = false;
      if (!err) this.pump(); // an error comes as the "error" event too
    });
  }

  /** Resolves once every queued message was written (or the link is gone). */
  flush() {
    if (this.lost || (!this.writing && this.queue.length === 0)) return Promise.resolve();
    return new Promise((resolve) => this.drained.push(resolve));
  }

  lose() {
    if (this.lost) return;
    this.lost = true;
    this.queue.length = 0;
    for (const resolve of this.drained.splice(0)) resolve();
    this.socket.destroy();
    this.onLost();
  }
}

// --- the runtime -----------------------------------------------------------------------------

const kUnread = Symbol("corral.unread"); // a connection whose first request is not read yet
const kOpen = Symbol("corral.open"); // the in-flight records of a connection's requests

/** What setup and the application's handlers use. Made by workerMain. */
export class WorkerRuntime {
  constructor(options = {}) {
    this.redact = options.redact || defaultRedact;
    // prepare(runtime) (may return a promise): runs before `start` is handled, with no address
    // yet (a spare has none); `start` waits for it.
    this.prepare = options.prepare || null;
    this.forceExitMs = options.forceExitMs ?? FORCE_EXIT_MS;
    this.watchdog = options.watchdog ?? true;
    this.controlFd = Number(process.env.CORRAL_CONTROL_FD);
    this.listenFd = Number(process.env.CORRAL_LISTEN_FD);
    // The address's wire form (printable, safe in JSON and logs); addressBytes is the address.
    this.address = process.env.CORRAL_ADDRESS || "";
    this.addressBytes = decodeAddress(this.address) || Buffer.alloc(0);
    this.stateDir = process.env.CORRAL_STATE_DIR || "";
    this.startData = null;
    this.scripts = [];
    this.codeVersion = null;
    this.codeDir = null;

    this._closers = [];
    this._reloadHook = null;
    this._reloads = []; // `reload` messages not applied yet, in arrival order
    this._reloading = false;
    this._inflight = 0;
    this._upgraded = 0; // of _inflight: the open upgraded connections
    this._busy = 0;
    this._reportedIdle = true;
    this._holdsSent = null; // the counts of the last `ready` or `idle` sent
    this._holdsTimer = null; // while not idle: the next counts report
    this._running = false; // between `ready` and the stop: idle flips are reported
    this._stopping = false;
    this._started = false; // a `start` arrived: the lock is being taken (or held)
    this._lockFd = null;
    this._lockHelper = null;
    this._server = null;
    this._link = null;
    this._inflightZero = [];
    this._setupDone = null; // setup's promise, once it runs
  }

  // --- what the application uses ---------------------------------------------------------------

  /** Runs at shutdown, in reverse order of registration; may return a promise (awaited). */
  onClose(closer) {
    this._closers.push(closer);
  }

  /** Registers the reload hook (in setup): fn({version, dir, scripts}) -> report (or a promise of
   * one). Without one, `ready` says the worker cannot reload in place. */
  onReload(fn) {
    this._reloadHook = fn;
  }

  /** The application's own work holds the worker busy (not idle). Every +1 needs its -1. */
  busyAdd(delta) {
    this._busy += delta;
    if (this._busy < 0) {
      log("busy_underflow", { address: this.address, busy: this._busy });
      this._busy = 0;
    }
    this._reportIdle();
  }

  /** The worker cannot go on: sends `fatal` with redact(err) (the original to stderr only), then
   * stops (closers run) with status 1. Returns to the caller. */
  fatal(err) {
    if (this._stopping) {
      log("worker_fatal_while_stopping", { address: this.address, error: String(err && err.message) });
      return;
    }
    log("worker_fatal", { address: this.address, error: String(err && err.message) });
    printError(err);
    this._send({ type: "fatal", error: this._publicError(err) });
    this.stop(EXIT_FATAL, "fatal");
  }

  log(event, fields) {
    log(event, fields);
  }

  // --- the lifecycle ---------------------------------------------------------------------------

  run(setup) {
    this._setup = setup;
    this._link = new ControlLink(this.controlFd, {
      onMessage: (m) => this._onControl(m),
      onLost: () => this.stop(EXIT_OK, "control_link_lost"),
      onTooLarge: () => this._onTooLarge(),
    });
    for (const signal of ["SIGTERM", "SIGINT"]) {
      process.on(signal, () => this.stop(EXIT_OK, signal.toLowerCase()));
    }
    process.on("uncaughtException", (e) => this._uncaught(e));
    process.on("unhandledRejection", (e) => this._uncaught(e));
    process.stderr.on("error", () => {}); // the manager gone: writes fail, the stop goes on
    const parent = process.ppid;
    setInterval(() => {
      if (process.ppid !== parent) this.stop(EXIT_OK, "parent_died");
    }, 1000).unref();
    this._prepared = this._prepare();
  }

  // The application's prepare hook, then `standby` for a spare (no address). A `start` that
  // arrives meanwhile waits for it (_onControl).
  async _prepare() {
    if (this.prepare) {
      try {
        await this.prepare(this);
      } catch (e) {
        this.fatal(e);
        return;
      }
    }
    if (!this._stopping && !this.address) this._send({ type: "standby" });
  }

  _uncaught(e) {
    log("uncaught_exception", { address: this.address, error: String(e && e.message) });
    if (this._stopping) printError(e);
    else this.fatal(e);
  }

  _onTooLarge() {
    // Without the `start` nothing can go on: say so rather than let the start timer run out.
    if (this._started || this._stopping) return;
    this._send({
      type: "fatal",
      error: publicJson(new PublicError("the start message is too large", "start_too_large")),
    });
    this.stop(EXIT_FATAL, "start_too_large");
  }

  _onControl(msg) {
    switch (msg.type) {
      case "shutdown":
        return this.stop(EXIT_OK, "shutdown");
      case "start":
        return void this._prepared.then(() => this._onStart(msg));
      case "reload":
        return this._onReload(msg);
      case "ping":
        // Answered on the event loop, which runs the lifecycle: a stuck loop answers nothing.
        if (!Number.isSafeInteger(msg.id) || msg.id < 0) {
          return log("control_message_dropped", { reason: "ping without an id" });
        }
        return this._send({ type: "pong", id: msg.id });
      default:
        return; // unknown types are ignored (forward compatibility)
    }
  }

  _onStart(msg) {
    if (this._started) return log("control_message_dropped", { reason: "a second start" });
    if (this._stopping) return;
    const lock = msg.lock;
    if (typeof lock !== "string" || !lock) {
      return log("control_message_dropped", { reason: "start without a lock path" });
    }
    if (typeof msg.address === "string" && msg.address && decodeAddress(msg.address)) {
      this.address = msg.address;
      this.addressBytes = decodeAddress(msg.address);
    }
    this.startData = msg.start === undefined ? null : msg.start;
    let set;
    try {
      set = codeSetOf(msg);
    } catch (e) {
      log("code_manifest_failed", { address: this.address, error: String(e && e.message) });
      this._send({
        type: "fatal",
        error: publicJson(new PublicError("the worker could not read its code set", "code_manifest_failed")),
      });
      return void this.stop(EXIT_FATAL, "code_manifest_failed");
    }
    this.scripts = set.scripts;
    this.codeVersion = set.version;
    this.codeDir = set.dir;
    this._started = true;
    this._takeLock(lock);
  }

  _takeLock(path) {
    let devnull = null;
    try {
      this._lockFd = fs.openSync(path, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
      devnull = fs.openSync("/dev/null", "r+");
      // The helper's fd 3 is our open file description; its fd 4 is /dev/null, not our listener.
      this._lockHelper = spawn(FLOCK, ["-x", "3"], {
        stdio: ["ignore", "ignore", "pipe", this._lockFd, devnull],
      });
    } catch (e) {
      return this._lockFailed(path, e.message);
    } finally {
      if (devnull !== null) fs.closeSync(devnull); // spawn returns after the exec: its copy is made
    }
    const helper = this._lockHelper;
    let stderr = "";
    helper.stderr.setEncoding("utf8");
    helper.stderr.on("data", (s) => {
      if (stderr.length < 4096) stderr += s;
    });
    const waitLog = setTimeout(() => log("lock_wait", { address: this.address, lock: path }), LOCK_WAIT_LOG_MS);
    let done = false;
    const finish = (error) => {
      if (done) return;
      done = true;
      clearTimeout(waitLog);
      this._lockHelper = null;
      if (this._stopping) return;
      if (error) this._lockFailed(path, error);
      else this._locked();
    };
    helper.on("error", (e) =>
      finish(e.code === "ENOENT" ? `${FLOCK}(1) not found (util-linux): ${e.message}` : e.message),
    );
    helper.on("close", (code, signal) => {
      if (code === 0) finish(null);
      else finish(`${FLOCK}(1) ended with ${signal || `status ${code}`}: ${stderr.trim()}`);
    });
  }

  _lockFailed(path, error) {
    log("lock_failed", { address: this.address, lock: path, error: String(error) });
    if (this._stopping) return;
    this._send({
      type: "fatal",
      error: publicJson(new PublicError("the worker could not take its address lock", "lock_failed")),
    });
    this.stop(EXIT_FATAL, "lock_failed");
  }

  async _locked() {
    // The lock fd stays open (close-on-exec) until the process exits, after the closers.
    this._send({ type: "started" });
    let app;
    try {
      this._setupDone = Promise.resolve(this._setup(this));
      app = await this._setupDone;
    } catch (e) {
      return this.fatal(e);
    }
    if (this._stopping) return;
    const handlers = typeof app === "function" ? { request: app } : app || {};
    if (typeof handlers.request !== "function") {
      return this.fatal(new TypeError("setup returned no request handler"));
    }
    try {
      this._server = await this._serve(handlers);
    } catch (e) {
      return this.fatal(e);
    }
    if (this._stopping) return;
    this._running = true;
    this._reportedIdle = this._idle();
    const ready = { type: "ready", idle: this._reportedIdle, ping: true, ...this._holds() };
    if (this._reloadHook) ready.reload = true;
    this._holdsSent = this._holds();
    this._send(ready);
    if (!this._reportedIdle) this._armHoldsReport();
    log("worker_ready", { address: this.address });
    this._nextReload();
  }

  _serve({ request, upgrade }) {
    const server = http.createServer({ maxHeaderSize: 64 * 1024 });
    // The proxy keeps a pool of keep-alive connections: do not close them under it.
    server.keepAliveTimeout = 0;
    server.requestTimeout = 0; // a streamed upload may take long; the proxy bounds its requests
    server.on("connection", (socket) => {
      socket[kUnread] = true;
      socket[kOpen] = new Set();
      this._requestStarted();
      socket.once("close", () => {
        this._firstRequestRead(socket);
        for (const finish of [...socket[kOpen]]) finish();
      });
    });
    server.on("request", (req, res) => {
      // The proxy's sequence number of a pipelined request goes back with its answer, so that
      // the proxy knows the answer is this request's (docs/worker-protocol.md, "Pipelining").
      const seq = req.headers["corral-seq"];
      if (seq !== undefined) res.setHeader("Corral-Seq", seq);
      // This request's W3C traceparent as the proxy sent it (the client's when valid, else one
      // corral made; the access log carries the same value), beside req.method, req.url and
      // req.headers; undefined when the request had none.
      req.traceparent = req.headers.traceparent;
      const socket = req.socket;
      const finish = this._track(socket);
      res.once("finish", finish);
      res.once("close", finish);
      if (this._stopping) res.shouldKeepAlive = false;
      this._call(request, [req, res], () => {
        if (!res.headersSent) {
          res.writeHead(500, { "Content-Type": "text/plain; charset=utf-8", "Content-Length": 15 });
          res.end("internal error\n");
        } else {
          res.destroy();
        }
      });
    });
    if (typeof upgrade === "function") {
      // An upgraded connection holds the worker until it closes.
      server.on("upgrade", (req, socket, head) => {
        this._upgraded += 1;
        this._track(socket, () => (this._upgraded -= 1));
        this._call(upgrade, [req, socket, head], () => socket.destroy());
      });
    }
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      // The manager listens with a backlog of 128; Node listens again with this one (the
      // kernel caps it at net.core.somaxconn).
      server.listen({ fd: this.listenFd, backlog: 4096 }, () => {
        server.off("error", reject);
        server.on("error", (e) => log("http_server_error", { error: e.message }));
        resolve(server);
      });
    });
  }

  // A request (or an upgraded connection) in flight until the returned function runs; a closed
  // connection finishes all of its own.
  _track(socket, onDone) {
    const open = socket[kOpen] || (socket[kOpen] = new Set());
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      open.delete(finish);
      if (onDone) onDone();
      this._requestFinished();
    };
    open.add(finish);
    this._requestStarted();
    this._firstRequestRead(socket); // after: no idle flip in between
    return finish;
  }

  _call(fn, args, onError) {
    const fail = (e) => {
      log("route_failed", { path: String(args[0] && args[0].url), error: String(e && e.message) });
      try {
        onError();
      } catch {
        // the connection is gone already
      }
    };
    try {
      const r = fn(...args);
      if (r && typeof r.then === "function") r.then(undefined, fail);
    } catch (e) {
      fail(e);
    }
  }

  _firstRequestRead(socket) {
    if (socket[kUnread]) {
      socket[kUnread] = false;
      this._requestFinished();
    }
  }

  _requestStarted() {
    this._inflight += 1;
    this._reportIdle();
  }

  _requestFinished() {
    this._inflight -= 1;
    this._reportIdle();
    if (this._inflight === 0) for (const resolve of this._inflightZero.splice(0)) resolve();
  }

  // --- reloads ---------------------------------------------------------------------------------

  _onReload(msg) {
    if (this._stopping) return; // a reload during a stop is ignored
    if (!Number.isSafeInteger(msg.id)) return log("control_message_dropped", { reason: "reload without an id" });
    this._reloads.push(msg);
    this._nextReload(); // before `ready` it waits in the queue
  }

  async _nextReload() {
    if (this._reloading || !this._running || this._reloads.length === 0) return;
    const msg = this._reloads.shift();
    let update;
    try {
      update = codeSetOf(msg);
    } catch (e) {
      const version = msg.code && typeof msg.code.version === "string" ? msg.code.version : null;
      log("worker_reload_failed", { address: this.address, id: msg.id, error: String(e && e.message) });
      this._send({
        type: "reloaded",
        id: msg.id,
        version,
        error: { message: "The new code set could not be read.", code: "code_manifest_failed" },
      });
      return this._nextReload();
    }
    const reply = { type: "reloaded", id: msg.id, version: update.version };
    if (!this._reloadHook) {
      // Nothing runs: no busy flip, just the refusal.
      reply.error = { message: "This worker cannot reload in place.", code: "no_reload" };
      this._send(reply);
      return this._nextReload();
    }
    this._reloading = true;
    this.busyAdd(1);
    try {
      try {
        const report = await this._reloadHook(update);
        reply.report = report === undefined || report === null ? {} : report;
        this.scripts = update.scripts;
        this.codeVersion = update.version;
        this.codeDir = update.dir;
        log("worker_reloaded", { address: this.address, id: msg.id, version: String(update.version) });
      } catch (e) {
        log("worker_reload_failed", { address: this.address, id: msg.id, error: String(e && e.message) });
        printError(e);
        reply.error = this._publicError(e);
      }
      if (!this._sendReloaded(reply) && this._link && !this._link.lost) {
        delete reply.report;
        reply.error = { message: "The reload report could not be sent.", code: "report_too_large" };
        this._sendReloaded(reply);
      }
    } finally {
      this._reloading = false;
      this._nextReload(); // the next one's busy +1 comes first: no idle flip between two reloads
      this.busyAdd(-1);
    }
  }

  _sendReloaded(reply) {
    try {
      return this._send(reply);
    } catch (e) {
      log("reload_report_invalid", { error: e.message }); // e.g. a report that is not JSON
      return false;
    }
  }

  // --- the stop --------------------------------------------------------------------------------

  /** Every way out: stop accepting, let requests finish, run the closers, exit. */
  async stop(status, why) {
    if (this._stopping) return;
    this._stopping = true;
    this._running = false;
    log("worker_stopping", { address: this.address, reason: why });
    this._armForceExit(status);
    if (this._lockHelper) this._lockHelper.kill("SIGKILL"); // no need to wait for the lock now
    if (this._server) {
      // No more accepts; open connections are served until the exit. Not http.Server's close():
      // from Node 19 on it also drops "idle" connections, which includes one just accepted whose
      // request is not parsed yet, the very request the accept-to-first-read count protects.
      net.Server.prototype.close.call(this._server);
      if (this._inflight > 0) {
        await new Promise((resolve) => {
          this._inflightZero.push(resolve);
          setTimeout(resolve, this.forceExitMs / 2); // running requests get half the time
        });
      }
    }
    // A stop during an async setup waits for it (within the forced exit): the closers it
    // registers release what it took.
    if (this._setupDone) await this._setupDone.catch(() => {});
    for (const closer of this._closers.reverse()) {
      try {
        await closer();
      } catch (e) {
        log("closer_failed", { address: this.address, error: String(e && e.message) });
      }
    }
    this._closers = [];
    // A `fatal` must leave before the exit, but a manager that stopped reading cannot hold it.
    if (this._link) {
      await Promise.race([this._link.flush(), new Promise((resolve) => setTimeout(resolve, FINAL_FLUSH_MS))]);
    }
    log("worker_exit", { address: this.address, status });
    process.exit(status);
  }

  _armForceExit(status) {
    setTimeout(() => {
      log("worker_force_exit", { reason: `the stop took longer than ${this.forceExitMs} ms` });
      process.exit(status);
    }, this.forceExitMs);
    // If the loop itself is stuck, the timer above never runs: a process of its own kills this
    // one (by signal: a status cannot be chosen from there). It waits on a pipe from here: this
    // process's exit, however it comes, is an EOF that ends it without a kill, so a recycled pid
    // is never hit. (A worker_threads watchdog would also do, but process.exit joins a thread
    // still booting: tens of ms per stop, seconds on a loaded machine.)
    if (!this.watchdog) return;
    let devnull = null;
    try {
      devnull = fs.openSync("/dev/null", "r+");
      const script = 'timeout "$1" cat >/dev/null; [ $? -eq 124 ] && kill -KILL "$0"';
      const seconds = ((this.forceExitMs + WATCHDOG_EXTRA_MS) / 1000).toFixed(3);
      const watchdog = spawn("/bin/sh", ["-c", script, String(process.pid), seconds], {
        stdio: ["pipe", "ignore", "ignore", devnull, devnull], // fds 3 and 4: not our sockets
      });
      watchdog.on("error", (e) => log("watchdog_failed", { error: e.message }));
      watchdog.stdin.on("error", () => {});
      watchdog.stdin.unref();
      watchdog.unref();
    } catch (e) {
      log("watchdog_failed", { error: e.message });
    } finally {
      if (devnull !== null) fs.closeSync(devnull);
    }
  }

  // --- helpers ---------------------------------------------------------------------------------

  _idle() {
    return this._inflight === 0 && this._busy === 0;
  }

  // What holds the worker (issue 14): requests in flight, open upgraded connections, busy count.
  _holds() {
    return {
      requests: Math.max(0, this._inflight - this._upgraded),
      upgraded: this._upgraded,
      busy: this._busy,
    };
  }

  _reportIdle() {
    if (!this._running) return;
    const idle = this._idle();
    if (idle !== this._reportedIdle) {
      this._reportedIdle = idle;
      this._holdsSent = this._holds();
      this._send({ type: "idle", idle, ...this._holdsSent });
      if (idle) {
        clearTimeout(this._holdsTimer);
        this._holdsTimer = null;
      } else {
        this._armHoldsReport();
      }
    }
  }

  // While not idle, the counts go out at most once a second when they changed since the last
  // report (a timer, not per request: a busy worker's requests cost no message each).
  _armHoldsReport() {
    if (this._holdsTimer) return;
    this._holdsTimer = setTimeout(() => {
      this._holdsTimer = null;
      if (!this._running || this._reportedIdle) return;
      const h = this._holds();
      const s = this._holdsSent || {};
      if (h.requests !== s.requests || h.upgraded !== s.upgraded || h.busy !== s.busy) {
        this._holdsSent = h;
        this._send({ type: "idle", idle: false, ...h });
      }
      this._armHoldsReport();
    }, HOLDS_REPORT_MS);
    this._holdsTimer.unref();
  }

  _send(msg) {
    return this._link ? this._link.send(msg) : false;
  }

  _publicError(err) {
    try {
      return publicJson(this.redact(err));
    } catch {
      return publicJson(defaultRedact(err)); // a broken redact must not leak the original either
    }
  }
}

function printError(err) {
  try {
    process.stderr.write(`${(err && err.stack) || String(err)}\n`);
  } catch {
    // stderr's reader is gone
  }
}

/**
 * Runs the worker: setup(runtime) returns (or resolves to) the request listener `(req, res)` or
 * `{ request, upgrade }`; options: `redact(err) -> PublicError | {message, code?, reason?}`,
 * `prepare(runtime)` (before `start`, without an address: a warm spare's own setup),
 * `forceExitMs` (3000), `watchdog` (true: a process that kills a stop stuck past forceExitMs).
 * Returns the runtime; the process exits when the worker stops.
 */
export function workerMain(setup, options = {}) {
  const env = process.env;
  if (!/^\d+$/.test(env.CORRAL_CONTROL_FD || "") || !/^\d+$/.test(env.CORRAL_LISTEN_FD || "")) {
    process.stderr.write("not started by a worker manager: CORRAL_CONTROL_FD/CORRAL_LISTEN_FD unset\n");
    process.exit(EXIT_BAD_ENVIRONMENT);
  }
  const runtime = new WorkerRuntime(options);
  try {
    runtime.run(setup);
  } catch (e) {
    log("worker_environment", { error: e.message });
    process.exit(EXIT_BAD_ENVIRONMENT);
  }
  return runtime;
}
