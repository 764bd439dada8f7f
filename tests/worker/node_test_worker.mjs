// A worker on lib/node/corral-worker.mjs for test_node_worker.py: what the counter example does not
// show. Its behaviour is chosen by environment variables:
//
//   TEST_CLOSER=hang-async   a closer whose promise never settles (the force-exit timer ends it)
//   TEST_CLOSER=hang-sync    a closer that never yields the thread (the watchdog ends it)
//   TEST_CLOSER=throws       a closer that throws (the next one still runs)
//   TEST_SETUP=rejects       setup rejects (a fatal with the redacted error)
//   TEST_SETUP=slow          setup takes 300 ms before it registers its closers
//   TEST_NO_WATCHDOG=1       workerMain's watchdog off
//
// Routes: GET /slow?ms=N, GET /uncaught (an exception nothing catches, after the response),
// GET /rejects (a handler whose promise rejects), anything else "ok METHOD PATH"; an upgrade to
// any protocol is answered 101 and echoes every byte after it. The closers append their names to
// <state dir>/closers.

import fs from "node:fs";
import path from "node:path";

import { PublicError, workerMain } from "../../lib/node/corral-worker.mjs";

workerMain(
  async (runtime) => {
    await new Promise((resolve) => setTimeout(resolve, process.env.TEST_SETUP === "slow" ? 300 : 1));
    if (process.env.TEST_SETUP === "rejects") throw new Error("setup met secret-456");
    const ran = path.join(runtime.stateDir, "closers");
    const note = (name) => fs.appendFileSync(ran, `${name}\n`);
    runtime.onClose(() => note("first"));
    runtime.onClose(async () => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      note("second");
    });
    const closer = process.env.TEST_CLOSER;
    if (closer === "hang-async") runtime.onClose(() => new Promise(() => {}));
    if (closer === "hang-sync") runtime.onClose(() => { for (;;); });
    if (closer === "throws") runtime.onClose(() => { throw new Error("closer broke"); });
    runtime.onClose(() => note("third"));
    const upgrade = (req, socket, head) => {
      // A toy protocol after the 101: every byte comes back.
      socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n");
      if (head.length) socket.write(head);
      socket.pipe(socket);
    };
    const request = (req, res) => {
      const url = new URL(req.url, "http://localhost");
      if (url.pathname === "/slow") {
        const ms = Number(url.searchParams.get("ms") || 0);
        setTimeout(() => res.end(`slow ${ms}\n`), ms);
      } else if (url.pathname === "/uncaught") {
        res.end("soon\n");
        setTimeout(() => { throw new Error("nobody caught secret-789"); }, 1);
      } else if (url.pathname === "/rejects") {
        return Promise.reject(new Error("the handler rejected"));
      } else {
        res.end(`ok ${req.method} ${url.pathname}\n`);
      }
    };
    return { request, upgrade };
  },
  {
    redact: () => new PublicError("the test worker failed", "test_failed"),
    watchdog: process.env.TEST_NO_WATCHDOG !== "1",
  },
);
