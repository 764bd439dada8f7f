// Unit tests of corral-worker.mjs: the sans-IO pieces (address wire form, file names, packet
// parsing, public errors), and the control link over a real SOCK_SEQPACKET socket (packet
// boundaries both ways, two packets arriving together, a packet too large for the buffer).
// Node cannot make a SEQPACKET pair, so a few lines of Python (python3, as the protocol suite
// uses) make it and run a Node child on fd 3. The whole lifecycle is the shared protocol suite's
// (tests/worker/test_worker_protocol.py, kind "node").
//
// Run: node --test lib/node/corral-worker.test.mjs (ctest: node.corral_worker).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import {
  PublicError,
  codeSetOf,
  decodeAddress,
  fileNameFor,
  parseManagerPacket,
  publicJson,
} from "./corral-worker.mjs";

const LIBRARY = pathToFileURL(fileURLToPath(new URL("./corral-worker.mjs", import.meta.url))).href;
const PYTHON = process.env.CORRAL_PYTHON || "python3";

test("the wire form decodes to the address's bytes", () => {
  assert.deepEqual(decodeAddress("doc:42"), Buffer.from("doc:42"));
  assert.deepEqual(
    decodeAddress("doc:%FF%0D%0A50%25 x\u00e9"),
    Buffer.concat([Buffer.from("doc:"), Buffer.from([0xff, 0x0d, 0x0a]), Buffer.from("50% x\u00e9")]),
  );
  assert.deepEqual(decodeAddress("a%2fb"), Buffer.from("a/b")); // lower-case hex is accepted
  assert.deepEqual(decodeAddress(""), Buffer.alloc(0));
  for (const bad of ["%", "%F", "%G1", "doc:50%", "x%%41"]) assert.equal(decodeAddress(bad), null, bad);
});

test("file names are core/escape.h's", () => {
  assert.equal(fileNameFor(Buffer.from("doc:42")), "doc%3A42");
  assert.equal(fileNameFor(Buffer.from("doc:../../escape")), "doc%3A..%2F..%2Fescape");
  assert.equal(fileNameFor(Buffer.alloc(0)), "%");
  assert.equal(fileNameFor(Buffer.from(".")), "%.");
  assert.equal(fileNameFor(Buffer.from("..")), "%..");
  assert.equal(fileNameFor(Buffer.from("a b\u00e9")), "a%20b%C3%A9");
  // Long names: a prefix never cut inside a %XX, "~", the base64url of 128 bits of the SHA-256
  // (the expected values are the Python example's file_name_for, itself checked against the C++).
  const ff = Buffer.concat([Buffer.from("doc:"), Buffer.alloc(250, 0xff)]);
  assert.equal(fileNameFor(ff), "doc%3A" + "%FF".repeat(57) + "~DWU-PcQ_A9HGQc6aPisudg");
  const a = Buffer.concat([Buffer.from("doc:" + "a".repeat(196)), Buffer.from([0xff])]);
  assert.equal(fileNameFor(a), "doc%3A" + "a".repeat(171) + "~AKASdYg9BFgxzBCw-8v8oA");
  const x = Buffer.from("k:" + "x".repeat(300));
  assert.equal(fileNameFor(x), "k%3A" + "x".repeat(173) + "~6Wob76Wxiph6VCuCf69Mhg");
  for (const name of [fileNameFor(ff), fileNameFor(a), fileNameFor(x)]) assert.ok(name.length <= 200);
});

test("a packet is one message, or dropped with a reason", () => {
  const parse = (text, capacity = 1024) => {
    const buf = Buffer.alloc(capacity);
    const n = buf.write(text);
    return parseManagerPacket(buf, n, capacity);
  };
  assert.deepEqual(parse('{"type":"start","lock":"/x"}'), { message: { type: "start", lock: "/x" } });
  assert.deepEqual(parse('{"type":"from-the-future","x":[1]}').message.type, "from-the-future");
  assert.match(parse("not json").drop, /^invalid/);
  assert.equal(parse('{"no":"type"}').drop, "invalid: no type");
  assert.equal(parse('{"type":7}').drop, "invalid: no type");
  assert.equal(parse('["type"]').drop, "invalid: not an object");
  assert.equal(parse("null").drop, "invalid: not an object");
  // Two objects in one packet are not two messages: boundaries are the kernel's, never guessed.
  assert.match(parse('{"type":"a"}{"type":"b"}').drop, /^invalid/);
  // A packet that filled the whole buffer was cut by the kernel.
  assert.deepEqual(parse('{"type":"x"}', 12), { drop: "too large", bytes: 12 });
});

test("public errors carry strings only", () => {
  assert.deepEqual(publicJson(new PublicError("the counter failed", "counter_failed")), {
    message: "the counter failed",
    code: "counter_failed",
  });
  assert.deepEqual(publicJson({ message: "m", code: 5, reason: "r" }), { message: "m", reason: "r" });
  assert.deepEqual(publicJson(null), { message: "internal error" });
  assert.deepEqual(publicJson(new PublicError("")), { message: "internal error" });
});

test("a code set without code is version and dir null", () => {
  assert.deepEqual(codeSetOf({ scripts: [] }), { version: null, dir: null, scripts: [] });
  assert.deepEqual(codeSetOf({ scripts: [{ path: "a" }], code: { version: "v", dir: "/d" } }), {
    version: "v",
    dir: "/d",
    scripts: [{ path: "a" }],
  });
  assert.deepEqual(codeSetOf({ code: "junk" }), { version: null, dir: null, scripts: [] });
});

test("a code set sent by reference is read from its manifest", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "corral-manifest-"));
  try {
    const manifest = path.join(dir, "v.json");
    const files = [{ path: "app.js", digest: "ab" }];
    fs.writeFileSync(manifest, JSON.stringify({ version: "v", files }));
    assert.deepEqual(codeSetOf({ code: { version: "v", dir: "/d", manifest } }), {
      version: "v",
      dir: "/d",
      scripts: files,
    });
    assert.throws(() => codeSetOf({ code: { version: "w", dir: "/d", manifest } }), /not the manifest/);
    assert.throws(() => codeSetOf({ code: { version: "v", manifest: path.join(dir, "none.json") } }), /ENOENT/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// The child: a ControlLink on fd 3 with a 4 KiB buffer, echoing what it reads; on "burst" it sends
// 400 messages of 1 kB in one tick, more than the socket's buffer holds while the harness does not
// read: Node's stream would then writev the queued ones into one packet if the link let it.
const CHILD = `
import { ControlLink } from ${JSON.stringify(LIBRARY)};
const link = new ControlLink(3, {
  capacity: 4096,
  onMessage(m) {
    if (m.type === "burst") for (let i = 1; i <= 400; i++) link.send({ type: "burst", i, pad: "p".repeat(1000) });
    else if (m.type === "bye") link.flush().then(() => process.exit(0));
    else link.send({ type: "echo", got: m });
  },
  onLost() { process.exit(3); },
});
`;

// The harness: makes the pair, sends two packets before the child runs (they arrive together),
// then a packet over the child's buffer, an invalid one, a burst request and bye; prints every
// packet the child sent, one JSON line each, and the child's status.
const HARNESS = `
import json, os, socket, subprocess, sys, time
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
ours.send(b'{"type":"one"}')
ours.send(b'{"type":"two","x":"' + b"y" * 2000 + b'"}')
child = subprocess.Popen([sys.argv[1], "--input-type=module", "-e", sys.argv[2]],
                         pass_fds=(3,), preexec_fn=lambda: os.dup2(theirs.fileno(), 3))
theirs.close()
ours.send(b'{"type":"big","x":"' + b"z" * 10000 + b'"}')
ours.send(b"not json")
ours.send(b'{"type":"three"}')
ours.send(b'{"type":"burst"}')
ours.send(b'{"type":"bye"}')
time.sleep(0.3)  # the child's socket buffer fills meanwhile
ours.settimeout(20)
while True:
    data = ours.recv(1 << 20)
    if not data:
        break
    print(json.dumps(data.decode()))
print(json.dumps({"status": child.wait(20)}))
`;

function runHarness() {
  return new Promise((resolve, reject) => {
    const p = spawn(PYTHON, ["-c", HARNESS, process.execPath, CHILD], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (err += d));
    const timer = setTimeout(() => p.kill("SIGKILL"), 30_000);
    p.on("error", reject);
    p.on("close", (code) => {
      clearTimeout(timer);
      if (code !== 0) return reject(new Error(`harness exited ${code}: ${err}`));
      resolve({ lines: out.trim().split("\n").map((l) => JSON.parse(l)), err });
    });
  });
}

test("the control link keeps packet boundaries both ways over SOCK_SEQPACKET", async () => {
  const { lines, err } = await runHarness();
  const status = lines.pop();
  assert.deepEqual(status, { status: 0 }, err);
  // Every packet the child sent is one JSON message: the harness printed each packet's text.
  const packets = lines.map((text) => JSON.parse(text));
  assert.deepEqual(
    packets.map((m) => (m.type === "echo" ? m.got.type : `${m.type}${m.i}`)),
    ["one", "two", "three", ...Array.from({ length: 400 }, (_, i) => `burst${i + 1}`)],
    err,
  );
  assert.equal(packets[1].got.x.length, 2000); // whole, although it arrived with "one"
  assert.match(err, /control_message_dropped reason="too large" bytes=4097/); // the 10 kB one, cut
  assert.match(err, /control_message_dropped reason="invalid: /); // "not json"
});
