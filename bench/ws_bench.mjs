// bench/ws_bench.mjs: WebSocket echo load from one Node process (the `ws` client from
// tests/node/node_modules). N clients, each keeping a window of W messages in flight: every echo
// received is counted and answered with the next message. Counts echoes over a measured interval
// after a warm-up; checks every echo's length.
//
//   node bench/ws_bench.mjs --url ws://127.0.0.1:PORT/ws/echo [--clients 50] [--window 8]
//        [--size 64] [--binary] [--warmup 2] [--duration 10] [--random-mask]
//   node bench/ws_bench.mjs --url ... --probe      # exit 0 once one echo came back
//
// Prints one JSON line: {"clients","window","size","seconds","messages" (measured),
// "total_messages" (warm-up included),"rate" (measured, per second),"mib_s","errors"}.
// No permessage-deflate (both servers then do the same work per byte). Masking keys are all zero
// (legal: RFC 6455 only asks for a key; `ws` then skips its own XOR) unless --random-mask: the
// servers still unmask every byte, but the single-threaded client is not slowed by masking
// 64 KiB messages in JavaScript. The client may still be the limit at high rates, which is why
// bench/ws_bench.sh also reports the server's CPU time per message.
import { createRequire } from 'node:module';

const require = createRequire(new URL('../tests/node/package.json', import.meta.url));
const WebSocket = require('ws');

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i < 0 ? dflt : process.argv[i + 1];
}
const url = arg('url');
const clients = Number(arg('clients', 50));
const window = Number(arg('window', 8));
const size = Number(arg('size', 64));
const warmup = Number(arg('warmup', 2));
const duration = Number(arg('duration', 10));
const binary = process.argv.includes('--binary') || size >= 1024;
const probe = process.argv.includes('--probe');
const zeroMask = !process.argv.includes('--random-mask');
if (!url) {
  console.error('ws_bench.mjs: --url is required');
  process.exit(2);
}

const payload = binary ? Buffer.alloc(size, 0x61) : 'a'.repeat(size);

function connect() {
  return new Promise((resolve, reject) => {
    const options = { perMessageDeflate: false, maxPayload: 1 << 30 };
    if (zeroMask) options.generateMask = (mask) => mask.fill(0);
    const ws = new WebSocket(url, options);
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}

if (probe) {
  const timer = setTimeout(() => process.exit(1), 2000);
  try {
    const ws = await connect();
    ws.once('message', (d) => {
      clearTimeout(timer);
      ws.terminate();
      process.exit(d.length === 5 ? 0 : 1);
    });
    ws.send('probe');
  } catch {
    process.exit(1);
  }
} else {
  let counting = false;
  let count = 0;
  let total = 0; // every echo of the run, warm-up included (server CPU per message)
  let errors = 0;
  const sockets = await Promise.all(Array.from({ length: clients }, connect));
  for (const ws of sockets) {
    ws.on('message', (data) => {
      if (data.length !== size) errors++;
      total++;
      if (counting) count++;
      ws.send(payload, { binary });
    });
    ws.on('error', () => errors++);
    ws.on('close', () => errors++);
    for (let i = 0; i < window; i++) ws.send(payload, { binary });
  }
  await new Promise((r) => setTimeout(r, warmup * 1000));
  counting = true;
  const t0 = process.hrtime.bigint();
  await new Promise((r) => setTimeout(r, duration * 1000));
  counting = false;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const messages = count;
  for (const ws of sockets) {
    ws.removeAllListeners('close');
    ws.terminate();
  }
  const rate = messages / seconds;
  console.log(
    JSON.stringify({
      clients,
      window,
      size,
      seconds: Number(seconds.toFixed(3)),
      messages,
      total_messages: total,
      rate: Math.round(rate),
      mib_s: Number(((rate * size) / 1048576).toFixed(1)),
      errors,
    })
  );
  process.exit(errors ? 1 : 0);
}
