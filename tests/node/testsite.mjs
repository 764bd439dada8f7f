// Shared by the node:test files: starts corral's e2e test site (CORRAL_TESTSITE, default
// ../../build/debug/corral_testsite) on a free port before the tests and stops it after them
// (SIGTERM; the exit status must be 0).
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const binary = process.env.CORRAL_TESTSITE
  ? path.resolve(process.env.CORRAL_TESTSITE)
  : path.resolve(here, '../../build/debug/corral_testsite');

// Returns { host, port, log }: filled once the site listens (read them inside tests).
export function useTestSite() {
  const site = { host: '', port: 0, log: '' };
  let proc;
  before(async () => {
    proc = spawn(binary, ['--listen', '127.0.0.1:0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        proc.kill('SIGKILL');
        reject(new Error(`server did not start:\n${site.log}`));
      }, 10_000);
      const onData = (chunk) => {
        site.log += chunk.toString();
        const m = /listening address=([\d.]+):(\d+)/.exec(site.log);
        if (m && !site.port) {
          clearTimeout(timer);
          site.host = m[1];
          site.port = Number(m[2]);
          resolve();
        }
      };
      proc.stdout.on('data', onData);
      proc.stderr.on('data', onData);
      proc.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      proc.on('exit', (code) => {
        if (!site.port) {
          clearTimeout(timer);
          reject(new Error(`server exited with ${code}:\n${site.log}`));
        }
      });
    });
  });
  after(async () => {
    if (!proc || proc.exitCode !== null) return;
    const exited = once(proc, 'exit');
    proc.kill('SIGTERM');
    const killer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    const [code] = await exited;
    clearTimeout(killer);
    assert.equal(code, 0, `server exit status ${code}:\n${site.log}`);
  });
  return site;
}
