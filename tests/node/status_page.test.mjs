// The status page live in a browser (src/control/status_page.h): Chromium (playwright-core from
// tests/node/package-lock.json, Debian's /usr/bin/chromium) on `/` of the admin listener of a
// `corral serve` with one worker kind (the Python example counter). The page lists the server
// processes, the kind and its two running addresses; a worker killed with SIGKILL shows `failed`
// within a second without a reload of the page (the event stream pushes it); its Retry button
// brings it back (running, a new pid); no CSP violation or script error on the page. A screenshot
// goes to the test's temporary directory (and to $STATUS_PAGE_SCREENSHOT when set: that is how
// docs/img/status-page.png is made).
//
// Skipped when chromium or CORRAL_BIN is missing, or Node is older than playwright-core needs
// (see notes_live.test.mjs). Run: cd tests/node && CORRAL_BIN=../../build/debug/corral node --test
// status_page.test.mjs
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { accessSync, constants, copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

const CHROMIUM = '/usr/bin/chromium';
const PYTHON = '/usr/bin/python3';
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const WORKER = path.join(REPO, 'examples', 'worker_python', 'worker.py');
const corral = process.env.CORRAL_BIN ? path.resolve(process.env.CORRAL_BIN) : '';
const SCALE = process.env.CORRAL_SANITIZED ? 3 : 1;
const WAIT = 15_000 * SCALE; // ms: the bound of every wait for something to start
// The push of a failure: the page shows it within a second (two under sanitizers, whose
// supervisor is several times slower on a busy machine).
const FAILED_WITHIN = process.env.CORRAL_SANITIZED ? 2_000 : 1_000;

function missing() {
  const { version, engines } = createRequire(import.meta.url)('playwright-core/package.json');
  const major = Number(/(\d+)/.exec(engines?.node ?? '')?.[1] ?? 0);
  if (Number(process.versions.node.split('.')[0]) < major)
    return `node ${process.versions.node} is older than ${major}, which playwright-core ` +
           `${version} needs`;
  for (const [what, file] of [['chromium', CHROMIUM], ['CORRAL_BIN', corral],
                              ['python3', PYTHON]]) {
    try {
      accessSync(file, constants.X_OK);
    } catch {
      return `${what} (${file || 'unset'}) is missing`;
    }
  }
  return '';
}
const skip = missing();

const srv = { proc: null, port: 0, admin: '', log: '', dir: '' };
let browser;

before(async () => {
  if (skip) return;
  srv.dir = mkdtempSync(path.join(os.tmpdir(), 'corral-status-page-'));
  const config = path.join(srv.dir, 'corral.toml');
  writeFileSync(config, `state_dir = ${JSON.stringify(path.join(srv.dir, 'state'))}

[workers.counter]
command = [${JSON.stringify(PYTHON)}, ${JSON.stringify(WORKER)}]
routes = ["/counter/{id}/*"]
`);
  srv.proc = spawn(corral, ['serve', '--config', config, '--listen', '127.0.0.1:0',
                            '--admin-listen', '127.0.0.1:0'],
                   { stdio: ['ignore', 'pipe', 'pipe'] });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`corral did not start:\n${srv.log}`)), WAIT);
    const onData = (chunk) => {
      srv.log += chunk.toString();
      const port = /\blistening address=[\d.]+:(\d+)/.exec(srv.log);
      const admin = /admin_listening url=(http:\/\/[\d.]+:\d+)/.exec(srv.log);
      if (port && admin && !srv.port) {
        clearTimeout(timer);
        srv.port = Number(port[1]);
        srv.admin = admin[1];
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
    const killer = setTimeout(() => srv.proc.kill('SIGKILL'), WAIT);
    const [code] = await exited;
    clearTimeout(killer);
    assert.equal(code, 0, `corral exit status ${code}:\n${srv.log.slice(-3000)}`);
  }
  if (srv.dir) rmSync(srv.dir, { recursive: true, force: true });
});

// A request through the server, which starts the address's worker.
async function counter(key) {
  const r = await fetch(`http://127.0.0.1:${srv.port}/counter/${key}/`,
                        { signal: AbortSignal.timeout(WAIT) });
  assert.equal(r.status, 200, await r.text());
}

const row = (address) => `#addresses tr[data-address="${address}"]`;

// The address's status and pid as the page shows them.
function shown(page, address) {
  return page.evaluate((sel) => {
    const tr = document.querySelector(sel);
    return tr ? { status: tr.cells[1].textContent, pid: Number(tr.cells[2].textContent) } : null;
  }, row(address));
}

function until(page, fn, arg, what, timeout = WAIT) {
  return page.waitForFunction(fn, arg, { timeout, polling: 'raf' }).catch(async (e) => {
    throw new Error(`${what}: ${e.message}\n(page: ${await page.evaluate(
      () => document.querySelector('main').innerText)})\nlog:\n${srv.log.slice(-3000)}`);
  });
}

test('the status page shows a killed worker failed at once, and Retry brings it back',
     { skip: skip || false }, async () => {
  await counter('a');
  await counter('b');
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const problems = [];
  try {
    const page = await context.newPage();
    page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    page.on('console', (m) => {
      // (the browser's own request for /favicon.ico answers 404: not the page's)
      if (m.type() === 'error' && !/\/favicon\.ico$/.test(m.location().url))
        problems.push(`console: ${m.text()} at ${m.location().url}`);
    });
    await page.goto(`${srv.admin}/`, { timeout: WAIT });

    // The processes, the kind and both addresses, running.
    const running = (sel) => document.querySelector(sel)?.cells[1].textContent === 'running';
    await until(page, running, row('counter:a'), 'counter:a shows running');
    await until(page, running, row('counter:b'), 'counter:b shows running');
    assert.ok(await page.locator('#processes tbody tr').count() >= 1);
    assert.equal(await page.locator('#kinds tr[data-kind="counter"]').count(), 1);
    assert.match(await page.locator('#supervisor').innerText(), /generation\s+1/);

    // kill -9: the page shows `failed` within a second, pushed (the page is not reloaded: a mark
    // set on its window is still there).
    const { pid } = await shown(page, 'counter:a');
    assert.ok(pid > 0);
    await page.evaluate(() => { window.statusMark = 'same page'; });
    const killedAt = Date.now();
    process.kill(pid, 'SIGKILL');
    await until(page, (sel) => document.querySelector(sel)?.cells[1].textContent === 'failed',
                row('counter:a'), `counter:a shows failed within ${FAILED_WITHIN} ms`,
                FAILED_WITHIN);
    const tookMs = Date.now() - killedAt;
    assert.equal(await page.evaluate(() => window.statusMark), 'same page');
    assert.match(await page.locator(row('counter:a')).innerText(), /worker_exited/);

    // Retry: the worker starts again (a new pid) and shows running.
    await page.locator(`${row('counter:a')} button[data-op="retry"]`).click({ timeout: WAIT });
    await until(page, ([sel, old]) => {
      const tr = document.querySelector(sel);
      return tr && tr.cells[1].textContent === 'running' && Number(tr.cells[2].textContent) !== old;
    }, [row('counter:a'), pid], 'counter:a shows running again with a new pid');
    await counter('a');

    const shot = path.join(srv.dir, 'status-page.png');
    await page.screenshot({ path: shot, fullPage: true });
    if (process.env.STATUS_PAGE_SCREENSHOT) copyFileSync(shot, process.env.STATUS_PAGE_SCREENSHOT);
    assert.deepEqual(problems, []);
    console.log(`failed shown ${tookMs} ms after the kill`);
  } finally {
    await context.close();
  }
});
