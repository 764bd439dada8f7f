// The notes demo live in a browser (issue 14): two Chromium tabs (two pages of one browser
// context, driven by playwright-core from tests/node/package-lock.json, Debian's /usr/bin/chromium)
// on one note of `corral serve`'s demo (no config: corral-notes-worker next to CORRAL_BIN). What
// one tab types appears in the other; "saved" shows only once the worker acknowledged the edit
// (committed to the note's file: GET /text has it); both tabs typing at once in two places end on
// the same text with both edits; after `corral ctl stop` of the note's worker both tabs reconnect
// (a new worker, whose pid the page then shows) and go on; no CSP violation, script error or
// failed request (the icon included) on the page.
//
// Skipped when chromium, CORRAL_BIN or corral-notes-worker beside it is missing, or Node is older
// than the one playwright-core's `engines` names (1.61.1: Node 18, so Debian 12's own 18.20 runs
// it). playwright-core is imported only after that check: a release whose engines exclude this
// Node throws from its import ("Playwright requires Node.js 20 or higher").
// Run: cd tests/node && npm ci && CORRAL_BIN=../../build/debug/corral node --test notes_live.test.mjs
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

const CHROMIUM = '/usr/bin/chromium';
const corral = process.env.CORRAL_BIN ? path.resolve(process.env.CORRAL_BIN) : '';
const worker = corral ? path.join(path.dirname(corral), 'corral-notes-worker') : '';
const WAIT = 15_000; // ms: the bound of every wait in a page

// The major version of Node that the installed playwright-core asks for ("engines": {"node":
// ">=18"}); 0 when it does not say.
function playwrightNode() {
  const { version, engines } = createRequire(import.meta.url)('playwright-core/package.json');
  return { version, major: Number(/(\d+)/.exec(engines?.node ?? '')?.[1] ?? 0) };
}

function missing() {
  const pw = playwrightNode();
  if (Number(process.versions.node.split('.')[0]) < pw.major)
    return `node ${process.versions.node} is older than ${pw.major}, which playwright-core ` +
           `${pw.version} needs`;
  for (const [what, file] of [['chromium', CHROMIUM], ['CORRAL_BIN', corral],
                              ['corral-notes-worker', worker]]) {
    try {
      accessSync(file, constants.X_OK);
    } catch {
      return `${what} (${file || 'unset'}) is missing`;
    }
  }
  return '';
}
const skip = missing();

const srv = { proc: null, port: 0, log: '', stateDir: '' };
let browser;

before(async () => {
  if (skip) return;
  srv.stateDir = mkdtempSync(path.join(os.tmpdir(), 'corral-notes-live-'));
  srv.proc = spawn(corral, ['serve', '--listen', '127.0.0.1:0', '--state-dir', srv.stateDir],
                   { stdio: ['ignore', 'pipe', 'pipe'] });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`corral did not start:\n${srv.log}`)), 20_000);
    const onData = (chunk) => {
      srv.log += chunk.toString();
      const m = /listening address=[\d.]+:(\d+)/.exec(srv.log);
      if (m && !srv.port) {
        clearTimeout(timer);
        srv.port = Number(m[1]);
        resolve();
      }
    };
    srv.proc.stdout.on('data', onData);
    srv.proc.stderr.on('data', onData);
    srv.proc.on('exit', (code) => {
      clearTimeout(timer);
      if (!srv.port) reject(new Error(`corral exited with ${code}:\n${srv.log}`));
    });
  });
  // The flags this machine's probe found needed (no background connections to the closed
  // network); headless, a fresh profile per launch.
  const { chromium } = await import('playwright-core');
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    timeout: 60_000,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  if (browser) await browser.close();
  if (srv.proc && srv.proc.exitCode === null) {
    const exited = once(srv.proc, 'exit');
    srv.proc.kill('SIGTERM');
    const killer = setTimeout(() => srv.proc.kill('SIGKILL'), 15_000);
    const [code] = await exited;
    clearTimeout(killer);
    assert.equal(code, 0, `corral exit status ${code}:\n${srv.log.slice(-3000)}`);
    assert.ok(!srv.log.includes('worker_failed'), srv.log.slice(-3000));
  }
  if (srv.stateDir) rmSync(srv.stateDir, { recursive: true, force: true });
});

const base = () => `http://127.0.0.1:${srv.port}`;

async function noteText(key) {
  const r = await fetch(`${base()}/note/${key}/text`, { signal: AbortSignal.timeout(WAIT) });
  assert.equal(r.status, 200);
  return r.text();
}

// A tab on the note, once its socket is open (the greeting sets the status to "revision N").
async function openTab(context, key, problems) {
  const page = await context.newPage();
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console: ${m.text()} at ${m.location().url}`);
  });
  // The page's icon is there (a 404 here was every tab's console error).
  page.on('response', (r) => {
    if (r.status() >= 400) problems.push(`${r.status()} for ${r.url()}`);
  });
  await page.goto(`${base()}/note/${key}/`, { timeout: WAIT });
  await page.waitForFunction(
    () => /^revision \d+$/.test(document.getElementById('status').textContent), null,
    { timeout: WAIT });
  return page;
}

const value = (page) => page.evaluate(() => document.getElementById('text').value);
const pidShown = (page) => page.evaluate(() => document.getElementById('pid').textContent);

// The pid of the worker serving `address` (`corral ctl workers --json`).
function workerPid(address) {
  const r = spawnSync(corral, ['ctl', 'workers', '--json', '--state-dir', srv.stateDir],
                      { encoding: 'utf8', timeout: WAIT });
  assert.equal(r.status, 0, r.error ? String(r.error) : r.stdout + r.stderr);
  const pid = JSON.parse(r.stdout)[address]?.pid;
  assert.ok(pid, `no worker for ${address}: ${r.stdout}`);
  return pid;
}
const status = (page) => page.evaluate(() => document.getElementById('status').textContent);

function until(page, fn, arg, what) {
  return page.waitForFunction(fn, arg, { timeout: WAIT }).catch(async (e) => {
    throw new Error(`${what}: ${e.message}\n(value ${JSON.stringify(await value(page))}, ` +
                    `status ${JSON.stringify(await status(page))})`);
  });
}

// Types `text` with the caret at `at` (a position, or 'end').
async function typeAt(page, at, text) {
  await page.evaluate((at) => {
    const t = document.getElementById('text');
    t.focus();
    const p = at === 'end' ? t.value.length : at;
    t.setSelectionRange(p, p);
  }, at);
  await page.keyboard.type(text, { delay: 15 });
}

const hasValue = (want) => document.getElementById('text').value === want;
const saved = () => /^saved, revision \d+$/.test(document.getElementById('status').textContent);

test('two tabs on one note see each other\'s edits', { skip: skip || false }, async () => {
  const context = await browser.newContext();
  const problems = [];
  try {
    const one = await openTab(context, 'tabs', problems);
    const two = await openTab(context, 'tabs', problems);

    // Tab one types: tab two shows it; tab one says "saved" once the worker acknowledged it,
    // and by then the note's text is committed.
    await typeAt(one, 'end', 'hello from one');
    await until(two, hasValue, 'hello from one', 'tab two shows tab one\'s text');
    await until(one, saved, null, 'tab one says saved');
    assert.equal(await noteText('tabs'), 'hello from one');

    // And back.
    await typeAt(two, 'end', ', and two');
    await until(one, hasValue, 'hello from one, and two', 'tab one shows tab two\'s text');
    await until(two, saved, null, 'tab two says saved');
    assert.equal(await noteText('tabs'), 'hello from one, and two');

    // Both at once, in two places: the edits that cross are refused as stale, merged and sent
    // again; both tabs end on one text that has both.
    await Promise.all([typeAt(one, 0, '[one] '), typeAt(two, 'end', ' [two]')]);
    const want = '[one] hello from one, and two [two]';
    await until(one, hasValue, want, 'tab one has both edits');
    await until(two, hasValue, want, 'tab two has both edits');
    await until(one, () => !/saving|editing/.test(document.getElementById('status').textContent),
                null, 'tab one settled');
    await until(two, () => !/saving|editing/.test(document.getElementById('status').textContent),
                null, 'tab two settled');
    assert.equal(await noteText('tabs'), want);

    // The note's worker stops (as an idle stop would): both tabs lose their socket, reconnect to a
    // new worker (the upgrade request starts it) and go on; each names the new worker's pid.
    const oldPid = workerPid('note:tabs');
    assert.equal(await pidShown(one), String(oldPid));
    assert.equal(await pidShown(two), String(oldPid));
    const stop = spawnSync(corral, ['ctl', 'stop', 'note:tabs', '--state-dir', srv.stateDir],
                           { encoding: 'utf8', timeout: WAIT });
    assert.equal(stop.status, 0, stop.error ? String(stop.error) : stop.stdout + stop.stderr);
    await typeAt(two, 'end', ' again');
    await until(one, hasValue, want + ' again', 'tab one shows tab two\'s edit after the stop');
    await until(two, saved, null, 'tab two says saved after the stop');
    assert.equal(await noteText('tabs'), want + ' again');
    const newPid = workerPid('note:tabs');
    assert.notEqual(newPid, oldPid);
    for (const tab of [one, two])
      await until(tab, (pid) => document.getElementById('pid').textContent === pid,
                  String(newPid), 'the tab names the new worker');

    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});
