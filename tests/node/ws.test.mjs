// corral's WebSocket routes against Node's `ws` client (tests/node/package.json): echo of text and
// binary, a message sent in fragments (send(..., { fin: false })), permessage-deflate with a large
// compressible message, 100 sockets at once, ping/pong, the close codes (a client close echoed, the
// server's 4000 from "close-me", 1009 from /ws/limited) and the handshake refusals seen from a
// client. Starts the test site on a free port and stops it at the end (SIGTERM: exit status 0).
//
// Run: cd tests/node && npm ci && CORRAL_TESTSITE=../../build/debug/corral_testsite node --test ws.test.mjs
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import assert from 'node:assert/strict';

import WebSocket from 'ws';

import { useTestSite } from './testsite.mjs';

const site = useTestSite();
const base = () => `ws://${site.host}:${site.port}`; // ws://127.0.0.1:PORT

// Bounds every wait: a hung socket fails the test with a message instead of hanging the run.
function within(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function open(pathname = '/ws/echo', protocols = undefined, options = {}) {
  const ws = new WebSocket(`${base()}${pathname}`, protocols, options);
  await within(once(ws, 'open'), 10_000, `open ${pathname}`);
  return ws;
}

// The next message: { data: Buffer, isBinary }.
async function nextMessage(ws, ms = 10_000) {
  const [data, isBinary] = await within(once(ws, 'message'), ms, 'a message');
  return { data, isBinary };
}

// The close event: { code, reason (string) }.
function closed(ws) {
  return within(
    once(ws, 'close').then(([code, reason]) => ({ code, reason: reason.toString() })),
    10_000,
    'the close event'
  );
}

test('echo text and binary', async () => {
  const ws = await open();
  ws.send('héllo ✓');
  let m = await nextMessage(ws);
  assert.equal(m.isBinary, false);
  assert.equal(m.data.toString(), 'héllo ✓');
  const bin = randomBytes(1000);
  ws.send(bin);
  m = await nextMessage(ws);
  assert.equal(m.isBinary, true);
  assert.deepEqual(m.data, bin);
  ws.send(Buffer.alloc(0));
  m = await nextMessage(ws);
  assert.equal(m.isBinary, true);
  assert.equal(m.data.length, 0);
  const big = randomBytes(3 * 1024 * 1024); // incompressible, 64-bit length
  ws.send(big);
  m = await nextMessage(ws);
  assert.ok(m.data.equals(big));
  ws.close(1000);
  assert.equal((await closed(ws)).code, 1000);
  // A close without a code is answered without one: ws reports 1005 (no status).
  const ws2 = await open();
  ws2.close();
  assert.equal((await closed(ws2)).code, 1005);
});

for (const perMessageDeflate of [false, true]) {
  test(`fragmented send (perMessageDeflate ${perMessageDeflate})`, async () => {
    const ws = await open('/ws/echo', undefined, { perMessageDeflate });
    ws.send('frag', { fin: false });
    ws.send('ment', { fin: false });
    ws.send('ed ✓', { fin: true });
    let m = await nextMessage(ws);
    assert.equal(m.isBinary, false);
    assert.equal(m.data.toString(), 'fragmented ✓');
    const parts = [randomBytes(70_000), randomBytes(10), Buffer.alloc(0), randomBytes(5000)];
    parts.forEach((p, i) => ws.send(p, { binary: true, fin: i === parts.length - 1 }));
    m = await nextMessage(ws);
    assert.equal(m.isBinary, true);
    assert.ok(m.data.equals(Buffer.concat(parts)));
    // A ping between fragments is answered; the message still arrives whole.
    // (Both listeners first: the pong and the message may arrive in one read.)
    ws.send('a', { fin: false });
    const pong = within(once(ws, 'pong'), 10_000, 'pong between fragments');
    const message = nextMessage(ws);
    ws.ping('mid');
    ws.send('b', { fin: true });
    assert.equal((await pong)[0].toString(), 'mid');
    assert.equal((await message).data.toString(), 'ab');
    ws.close(1000);
    await closed(ws);
  });
}

test('permessage-deflate with a large compressible message', async () => {
  const ws = await open('/ws/echo', undefined, { perMessageDeflate: true });
  assert.match(ws.extensions, /permessage-deflate/);
  let wire = 0;
  ws._socket.on('data', (chunk) => (wire += chunk.length));
  const text = 'the quick brown fox jumps over the lazy dog. '.repeat(200_000); // ~9 MB
  ws.send(text);
  const m = await nextMessage(ws, 30_000);
  assert.equal(m.data.length, text.length);
  assert.equal(m.data.toString(), text);
  assert.ok(wire < text.length / 20, `reply not compressed: ${wire} bytes on the wire`);
  ws.send(randomBytes(200_000)); // incompressible, compressed frames both ways
  assert.equal((await nextMessage(ws)).data.length, 200_000);
  ws.close(1000);
  assert.equal((await closed(ws)).code, 1000);
});

test('100 sockets at once', async () => {
  const sockets = await Promise.all(Array.from({ length: 100 }, () => open()));
  const replies = await Promise.all(
    sockets.map(async (ws, i) => {
      const reply = nextMessage(ws);
      ws.send(`socket ${i}`);
      return (await reply).data.toString();
    })
  );
  replies.forEach((r, i) => assert.equal(r, `socket ${i}`));
  const closes = sockets.map((ws) => closed(ws));
  sockets.forEach((ws) => ws.close(1000, 'done'));
  for (const c of await Promise.all(closes)) assert.equal(c.code, 1000);
});

test('ping gets a pong with the same payload', async () => {
  const ws = await open();
  for (const payload of ['', 'ping-data', 'x'.repeat(125)]) {
    const pong = within(once(ws, 'pong'), 10_000, 'pong');
    ws.ping(payload);
    assert.equal((await pong)[0].toString(), payload);
  }
  ws.close();
  await closed(ws);
});

test('client close codes are echoed', async () => {
  for (const code of [1000, 1001, 3000, 4999]) {
    const ws = await open();
    const c = closed(ws);
    ws.close(code, 'bye');
    assert.equal((await c).code, code);
  }
});

test('server close: "close-me" gets 4000', async () => {
  const ws = await open();
  const c = closed(ws);
  ws.send('close-me');
  assert.deepEqual(await c, { code: 4000, reason: 'asked to' });
});

test('/ws/limited: 1009 above max_message, 4096 with a principal', async () => {
  let ws = await open('/ws/limited');
  ws.send('a'.repeat(1024));
  assert.equal((await nextMessage(ws)).data.length, 1024);
  let c = closed(ws);
  ws.send(Buffer.alloc(2000));
  assert.equal((await c).code, 1009);

  ws = await open('/ws/limited', undefined, { headers: { Authorization: 'Bearer t' } });
  ws.send('b'.repeat(4096));
  assert.equal((await nextMessage(ws)).data.length, 4096);
  c = closed(ws);
  ws.send('b'.repeat(4097));
  assert.equal((await c).code, 1009);
});

test('subprotocols, origin and refusals', async () => {
  let ws = await open('/ws/echo', ['echo.v1', 'echo.v2']);
  assert.equal(ws.protocol, 'echo.v2'); // the route's preference
  ws.close();
  await closed(ws);
  ws = await open('/ws/echo', undefined, { origin: `http://127.0.0.1:${site.port}` });
  ws.close();
  await closed(ws);
  ws = await open('/ws/echo', undefined, { origin: 'http://allowed.example' });
  ws.close();
  await closed(ws);

  const refused = async (url, options) => {
    const bad = new WebSocket(url, options);
    bad.on('error', () => {});
    const [, res] = await within(once(bad, 'unexpected-response'), 10_000, 'a refusal');
    res.resume();
    bad.terminate();
    return res;
  };
  let res = await refused(`${base()}/ws/echo`, { origin: 'http://evil.example' });
  assert.equal(res.statusCode, 403);
  res = await refused(`${base()}/ws/echo`, { protocolVersion: 8 });
  assert.equal(res.statusCode, 426);
  assert.equal(res.headers['sec-websocket-version'], '13');
});

test('who: the principal reaches the socket', async () => {
  let ws = new WebSocket(`${base()}/ws/who`);
  assert.equal((await nextMessage(ws)).data.toString(), 'anonymous');
  ws.close();
  ws = new WebSocket(`${base()}/ws/who`, { headers: { Authorization: 'Bearer t' } });
  assert.equal((await nextMessage(ws)).data.toString(), 'tester');
  ws.close();
  await closed(ws);
});
