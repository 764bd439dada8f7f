#!/usr/bin/env node
// A corral worker in Node.js on lib/node/corral-worker.mjs (docs/worker-protocol.md): the same
// counter as examples/worker_cpp and examples/worker_python, one per address, with the same routes
// (the shared protocol suite, tests/worker/test_worker_protocol.py, runs all three):
//
//   GET  /           the count
//   POST /inc        adds one, returns the new count
//   GET  /start      the start data the manager sent
//   GET  /busy?ms=N  holds the worker busy (not idle) for N ms, as background work would
//   GET  /slow?ms=N  answers after N ms (a request in flight: not idle meanwhile)
//   GET  /crash      aborts (a crash: the address becomes failed)
//   GET  /fatal      reports a fatal error whose text holds a secret; only the redacted form crosses
//   GET  /headers    the request's header lines as received, a JSON list of [name, value]
//   GET  /trace      the request's traceparent (req.traceparent, set by the library)
//   GET  /code       {version, hello, pid}: the code version running, hello.txt of its directory
//   POST /count      reads the request body as it streams and answers {"bytes": its length};
//                    nothing of it is kept
//   GET  /count/aborted  how many /count bodies this worker saw cut short (the client left)
//
// The count lives in <state dir>/data/<address>.count, the address percent-encoded as in the lock
// path ("doc%3A42.count"): read at setup, written by a closer at shutdown. The reload hook re-reads
// hello.txt from the new code directory; a new set holding a file named reload-fails is refused
// (code reload_failed: the old code stays), one holding reload-sleep-ms (a number) makes the hook
// take that long (requests are served meanwhile); CORRAL_NO_RELOAD=1 registers no hook (ready then
// says no reload support).
//
// Threading: one event loop; a request's handler runs to its end between others.

import fs from "node:fs";
import path from "node:path";

import { PublicError, fileNameFor, workerMain } from "../../lib/node/corral-worker.mjs";

const MAX_MS = 60_000;

class ReloadFailed extends Error {}

function readCodeFile(dir, name) {
  if (!dir) return null;
  try {
    return fs.readFileSync(path.join(dir, name), "utf8");
  } catch (e) {
    if (e.code === "ENOENT") return null;
    throw e;
  }
}

function reply(res, status, body, type = "text/plain; charset=utf-8") {
  const data = Buffer.from(body);
  res.writeHead(status, { "Content-Type": type, "Content-Length": data.length });
  res.end(res.req.method === "HEAD" ? undefined : data);
}

const json = (res, value) => reply(res, 200, JSON.stringify(value), "application/json");

function millis(query) {
  const n = parseInt(query.get("ms") || "0", 10);
  return Math.max(0, Math.min(Number.isFinite(n) ? n : 0, MAX_MS));
}

function setup(runtime) {
  const dataDir = path.join(runtime.stateDir || ".", "data");
  fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = path.join(dataDir, fileNameFor(runtime.addressBytes) + ".count");
  let count = 0;
  try {
    count = parseInt(fs.readFileSync(file, "utf8").trim() || "0", 10);
  } catch (e) {
    if (e.code !== "ENOENT") throw e;
  }
  runtime.onClose(() => {
    fs.writeFileSync(file + ".tmp", `${count}\n`);
    fs.renameSync(file + ".tmp", file);
  });

  // The version running and its hello.txt: one value, replaced whole by the reload hook, so that
  // no response mixes two sets.
  let code = { version: runtime.codeVersion, hello: readCodeFile(runtime.codeDir, "hello.txt") };
  if (process.env.CORRAL_NO_RELOAD !== "1") {
    runtime.onReload(async (update) => {
      // requests go on being served meanwhile: the hook only awaits
      const sleepMs = parseInt(readCodeFile(update.dir, "reload-sleep-ms") || "0", 10) || 0;
      if (sleepMs > 0) await new Promise((resolve) => setTimeout(resolve, Math.min(sleepMs, MAX_MS)));
      if (readCodeFile(update.dir, "reload-fails") !== null) {
        throw new ReloadFailed(`the set ${update.version} has a file named reload-fails`);
      }
      const hello = readCodeFile(update.dir, "hello.txt");
      code = { version: update.version, hello };
      return { hello };
    });
  }

  let uploadsAborted = 0;
  // Streamed: counted as it comes (the other routes get the body whole, req.body).
  const countUpload = (req, res) => {
    let bytes = 0;
    let ended = false;
    req.on("data", (c) => {
      bytes += c.length;
    });
    req.on("end", () => {
      ended = true;
      json(res, { bytes });
    });
    req.on("close", () => {
      if (!ended) {
        uploadsAborted++;
        runtime.log("upload_aborted", { bytes });
      }
    });
  };

  const routes = {
    "GET /": (req, res) => reply(res, 200, `${count}\n`),
    "GET /count/aborted": (req, res) => reply(res, 200, `${uploadsAborted}\n`),
    "POST /inc": (req, res) => reply(res, 200, `${++count}\n`),
    "GET /start": (req, res) =>
      json(res, { address: runtime.address, start: runtime.startData, scripts: runtime.scripts }),
    "GET /busy": (req, res, q) => {
      const ms = millis(q);
      runtime.busyAdd(1);
      setTimeout(() => runtime.busyAdd(-1), ms);
      reply(res, 200, `busy ${ms} ms\n`);
    },
    "GET /slow": (req, res, q) => {
      const ms = millis(q);
      setTimeout(() => reply(res, 200, `slow ${ms} ms\n`), ms); // in flight meanwhile
    },
    "GET /crash": () => process.abort(),
    "GET /fatal": (req, res) => {
      runtime.fatal(new Error("database refused password secret-123"));
      reply(res, 500, "fatal\n");
    },
    "GET /headers": (req, res) => {
      const pairs = [];
      for (let i = 0; i < req.rawHeaders.length; i += 2) pairs.push([req.rawHeaders[i], req.rawHeaders[i + 1]]);
      json(res, pairs);
    },
    "GET /trace": (req, res) => reply(res, 200, `${req.traceparent}\n`),
    "GET /code": (req, res) => json(res, { version: code.version, hello: code.hello, pid: process.pid }),
  };

  return (req, res) => {
    const url = new URL(req.url, "http://localhost");
    if (req.method === "POST" && url.pathname === "/count") return countUpload(req, res);
    const route = routes[`${req.method} ${url.pathname}`];
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      req.body = Buffer.concat(chunks);
      try {
        if (route) route(req, res, url.searchParams);
        else reply(res, 404, "not found\n");
      } catch (e) {
        runtime.log("route_failed", { path: url.pathname, error: String(e.message) });
        if (!res.headersSent) reply(res, 500, "internal error\n");
      }
    });
  };
}

function redact(err) {
  if (err instanceof ReloadFailed) return new PublicError("the new code cannot be loaded", "reload_failed");
  return new PublicError("the counter failed", "counter_failed");
}

workerMain(setup, { redact });
