// corral against Node's HTTP client, undici: plain requests, keep-alive reuse, pipelining (one
// connection, many requests in flight, answers in order), a streamed (chunked) upload, HEAD and
// 405. Starts the test site on a free port and stops it at the end.
//
// Run: cd tests/node && npm ci && CORRAL_TESTSITE=../../build/debug/corral_testsite node --test clients.test.mjs
import { Readable } from 'node:stream';
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { Client, Pool, request } from 'undici';

import { useTestSite } from './testsite.mjs';

const site = useTestSite();
const origin = () => `http://${site.host}:${site.port}`;

test('request GET /hello', async () => {
  const res = await request(`${origin()}/hello`);
  assert.equal(res.statusCode, 200);
  assert.equal(await res.body.text(), 'hello');
  assert.equal(res.headers.server, 'corral');
  assert.equal(res.headers['x-content-type-options'], 'nosniff');
  assert.ok(res.headers.date);
});

test('request GET /json parses', async () => {
  const res = await request(`${origin()}/json`);
  assert.equal(res.statusCode, 200);
  const doc = await res.body.json();
  assert.equal(doc.server, 'corral');
  assert.equal(doc.remote, '127.0.0.1');
});

test('pipelining: 100 requests on one connection, 10 in flight, answered in order', async () => {
  const pool = new Pool(origin(), { connections: 1, pipelining: 10 });
  let connects = 0;
  pool.on('connect', () => ++connects);
  let maxRunning = 0;
  try {
    const results = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const res = await pool.request({ path: `/users/${i}`, method: 'GET' });
        maxRunning = Math.max(maxRunning, pool.stats.running);
        return [res.statusCode, await res.body.json()];
      }),
    );
    results.forEach(([status, body], i) => {
      assert.equal(status, 200);
      assert.deepEqual(body, { id: String(i) });
    });
    assert.equal(connects, 1);
    assert.ok(maxRunning > 1, `never more than ${maxRunning} request in flight`);
  } finally {
    await pool.close();
  }
});

test('POST /upload with a stream body (chunked)', async () => {
  const chunks = Array.from({ length: 64 }, (_, i) => Buffer.alloc(1000 + i, 'u'));
  const expected = chunks.reduce((n, c) => n + c.length, 0);
  const res = await request(`${origin()}/upload`, {
    method: 'POST',
    body: Readable.from(chunks),
  });
  assert.equal(res.statusCode, 200);
  assert.equal(await res.body.text(), String(expected));
});

test('POST /echo with a stream body returns it', async () => {
  const res = await request(`${origin()}/echo`, {
    method: 'POST',
    headers: { 'content-type': 'text/plain' },
    body: Readable.from(['ab', 'cd', 'ef']),
  });
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers['content-type'], 'text/plain');
  assert.equal(await res.body.text(), 'abcdef');
});

test('keep-alive: sequential requests reuse one connection', async () => {
  const client = new Client(origin());
  let connects = 0;
  client.on('connect', () => ++connects);
  try {
    for (let i = 0; i < 5; ++i) {
      const res = await client.request({ path: `/users/${i}`, method: 'GET' });
      assert.equal(res.statusCode, 200);
      assert.deepEqual(await res.body.json(), { id: String(i) });
    }
    assert.equal(connects, 1);
  } finally {
    await client.close();
  }
});

test('HEAD /hello: length, no body', async () => {
  const res = await request(`${origin()}/hello`, { method: 'HEAD' });
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers['content-length'], '5');
  assert.equal(await res.body.text(), '');
});

test('405 with Allow', async () => {
  const res = await request(`${origin()}/hello`, { method: 'POST', body: 'x' });
  assert.equal(res.statusCode, 405);
  const allow = res.headers.allow.split(',').map((m) => m.trim());
  assert.ok(allow.includes('GET') && allow.includes('HEAD'), res.headers.allow);
  await res.body.dump();
});

test('chunked response stream arrives in ticks', async () => {
  const res = await request(`${origin()}/stream`);
  assert.equal(res.statusCode, 200);
  assert.equal(res.headers['transfer-encoding'], 'chunked');
  const text = await res.body.text();
  assert.deepEqual(
    text.trim().split('\n'),
    Array.from({ length: 10 }, (_, i) => `tick ${i}`),
  );
});
