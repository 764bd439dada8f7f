// bench/ws_echo_server.mjs: the reference for bench/ws_bench.sh, a WebSocket echo server on
// Node's `ws` (the same package and version as the tests: tests/node/package.json). Echoes every
// message with its type; no permessage-deflate (the clients do not offer it either).
//
//   node bench/ws_echo_server.mjs --listen 127.0.0.1:PORT
//
// Prints "listening address=HOST:PORT" once bound (the same line corral logs).
import { createRequire } from 'node:module';

const require = createRequire(new URL('../tests/node/package.json', import.meta.url));
const { WebSocketServer } = require('ws');

const args = process.argv.slice(2);
const listen = args[args.indexOf('--listen') + 1] ?? '127.0.0.1:0';
const [host, port] = listen.split(':');

const wss = new WebSocketServer({
  host,
  port: Number(port),
  path: '/ws/echo',
  perMessageDeflate: false,
  maxPayload: 64 * 1024 * 1024,
  clientTracking: false,
});
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  ws.on('error', () => {});
});
wss.on('listening', () => {
  const a = wss.address();
  console.log(`listening address=${a.address}:${a.port}`);
});
const stop = () => wss.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
