// corral's status page (src/control/status_page.h): draws each `view` that GET /events pushes, and
// calls the control API for its buttons. No framework, no inline handlers (the page runs under a
// CSP nonce); every text from the server goes in with textContent, never as HTML.
'use strict';

const $ = (id) => document.getElementById(id);
const form = $('filter');
let source = null;
let view = null;
let page = 0;
let per = 50;
const rates = new Map(); // process slot -> {t, requests, rate}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// "3d 4h", "5m 12s", "40s" since `since` (ms since the epoch).
function age(since) {
  if (!since) return '';
  let s = Math.max(0, Math.floor((Date.now() - since) / 1000));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  s %= 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

// A cell whose text is the age of `since`, kept current by the 1 s tick.
function ageCell(since) {
  return el('td', { 'data-since': since ? String(since) : null }, age(since));
}

function status(text) {
  return el('span', { class: `status ${text}` }, text);
}

function isoMs(iso) {
  const t = iso ? Date.parse(iso) : NaN;
  return Number.isNaN(t) ? 0 : t;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderSupervisor(v) {
  const s = v.supervisor;
  const facts = [['version', s.version], ['pid', s.pid], ['generation', s.generation],
                 ['reloads', s.reloads], ['up', null]];
  if (s.terminating) facts.push(['state', 'terminating']);
  if (s.workers) {
    facts.push(['workers live', s.workers.live], ['starting', s.workers.starting],
               ['queued', s.workers.queued], ['spares', s.workers.spares],
               ['max workers', s.workers.max_workers]);
    if (s.workers.closing) facts.push(['workers', 'closing']);
  }
  const dl = $('supervisor');
  dl.replaceChildren(...facts.map(([k, val]) => {
    const dd = k === 'up' ? el('dd', { 'data-since': String(s.started_at * 1000) },
                               age(s.started_at * 1000))
                          : el('dd', null, val ?? '—');
    return el('div', null, el('dt', null, k), dd);
  }));
}

// Requests/s of a process from two views' cumulative counts (what its last report said).
function rate(slot, requests, now) {
  const last = rates.get(slot);
  const r = { t: now, requests, rate: last ? last.rate : null };
  if (last && requests !== last.requests && now > last.t)
    r.rate = (requests - last.requests) * 1000 / (now - last.t);
  else if (last && now - last.t >= 2000) r.rate = 0;
  if (!last || requests !== last.requests || now - last.t >= 2000) rates.set(slot, r);
  else r.rate = last.rate;
  return r.rate;
}

function h3(q) {
  if (!q) return '—';
  return `${q.steering}, ${q.connections} conn, ${q.requests} req, ` +
         `fwd ${q.forwarded_out}/${q.forwarded_in}`;
}

function renderProcesses(v) {
  const p = v.processes || { processes: [], draining: [] };
  const now = Date.now();
  const rows = p.processes.map((s) => {
    const total = s.http_requests ?? (s.proxy ? s.proxy.requests : null);
    const perSecond = total === null ? null : rate(s.index, total, now);
    return el('tr', { 'data-slot': String(s.index) },
      el('td', null, s.index), el('td', null, s.pid || '—'), el('td', null, status(s.status)),
      el('td', null, s.cpu >= 0 ? s.cpu : '—'), el('td', null, s.generation),
      s.pid ? ageCell(s.started_at * 1000) : el('td', null, '—'),
      el('td', null, s.restarts), el('td', null, s.last_exit || '—'),
      el('td', null, s.backoff_ms ? `${s.backoff_ms} ms` : '—'),
      el('td', null, perSecond === null ? '—' : perSecond.toFixed(1)),
      el('td', null, s.connections_open ?? '—'),
      el('td', null, h3(s.quic)));
  });
  for (const d of p.draining)
    rows.push(el('tr', null, el('td', null, d.index), el('td', null, d.pid),
                 el('td', null, status(d.status)), el('td', null, '—'),
                 el('td', null, d.generation), ageCell(d.since * 1000),
                 el('td', { colSpan: 6, class: 'muted' }, 'an older generation, draining')));
  fill($('processes').tBodies[0], rows);
}

function renderKinds(v) {
  const select = form.elements.kind;
  const chosen = select.value;
  const names = v.kinds.map((k) => k.name);
  const have = [...select.options].slice(1).map((o) => o.value);
  if (names.join('\n') !== have.join('\n')) {
    select.replaceChildren(el('option', { value: '' }, 'any'),
                           ...names.map((n) => el('option', { value: n }, n)));
    select.value = chosen;
  }
  fill($('kinds').tBodies[0], v.kinds.map((k) => el('tr', { 'data-kind': k.name },
    el('td', null, k.name), el('td', null, k.live), el('td', null, k.starting),
    el('td', null, k.running), el('td', null, k.queued), el('td', null, k.spares),
    el('td', null, k.failed), el('td', null, k.suspended),
    el('td', { class: 'address' }, k.version ? k.version.slice(0, 12) : '—',
       k.stale ? el('span', { class: 'muted' }, ` (${k.stale} stale)`) : null,
       k.rolling ? el('span', { class: 'muted' }, ' rolling out') : null),
    el('td', null, k.start_ms.samples ? `${k.start_ms.p50} / ${k.start_ms.p99} ms` : '—'),
    el('td', null, el('button', { type: 'button', 'data-rollout': k.name,
                                  disabled: k.rolling || k.version === null,
                                  title: 'Snapshot the code directory and roll it out' },
                      'rollout')))));
}

// The buttons an address's entry allows, each a control API route.
function actions(a) {
  const e = a.entry || {};
  const list = [];
  if (e.status === 'failed' || e.suspended) list.push('retry');
  if (['starting', 'running', 'queued'].includes(e.status)) list.push('stop');
  if (!e.suspended) list.push('suspend');
  if (e.suspended) list.push('resume');
  return list;
}

function holds(e) {
  if (!e.holds) return '—';
  const h = e.holds;
  return `${h.requests} req, ${h.upgraded} upgraded, ${h.busy} busy`;
}

function idleStop(e) {
  if (e.idle_stop_delayed) return 'delayed: ' + e.idle_stop_delayed;
  if (!e.idle_stop_at) return e.status === 'running' ? 'busy' : '—';
  return new Date(e.idle_stop_at).toLocaleTimeString();
}

function errorText(e) {
  if (!e.error) return '';
  const { message, code, reason } = e.error;
  return [code, message, reason].filter(Boolean).join(': ');
}

function renderAddresses(v) {
  const a = v.addresses;
  page = a.page;
  per = a.per;
  const first = a.total ? a.page * a.per + 1 : 0;
  const last = Math.min(a.total, (a.page + 1) * a.per);
  $('range').textContent = `${first}–${last} of ${a.total}` +
                           (a.total !== a.all ? ` (${a.all} in all)` : '');
  $('prev').disabled = a.page === 0;
  $('next').disabled = last >= a.total;
  fill($('addresses').tBodies[0], a.items.map((item) => {
    const e = item.entry || {};
    const st = e.suspended && e.status !== 'suspended' ? `${e.status}, suspended` : e.status;
    return el('tr', { 'data-address': item.address },
      el('td', { class: 'address' }, item.address), el('td', null, status(st || '—')),
      el('td', null, e.pid || '—'),
      e.startedAt && e.status !== 'failed' ? ageCell(isoMs(e.startedAt)) : el('td', null, '—'),
      el('td', null, holds(e)), el('td', null, idleStop(e)),
      el('td', { class: 'address' }, e.version ? e.version.slice(0, 12) : '—'),
      el('td', { class: 'error' }, errorText(e)),
      el('td', null, ...actions(item).map((op) =>
           el('button', { type: 'button', 'data-op': op, 'data-address': item.address }, op)),
         el('button', { type: 'button', 'data-tail': item.address }, 'output')));
  }));
}

function render(v) {
  view = v;
  renderSupervisor(v);
  renderProcesses(v);
  renderKinds(v);
  renderAddresses(v);
}

function say(text, bad) {
  const m = $('message');
  m.textContent = text;
  m.className = bad ? 'message bad' : 'message';
}

// The filter and page as a query string (what /events takes, and the page's own URL).
function query() {
  const q = new URLSearchParams();
  for (const name of ['q', 'kind', 'status']) {
    const value = form.elements[name].value.trim();
    if (value) q.set(name, value);
  }
  if (page) q.set('page', String(page));
  if (per !== 50) q.set('per', String(per));
  return q.toString();
}

function connect() {
  if (source) source.close();
  const q = query();
  history.replaceState(null, '', q ? `?${q}` : location.pathname);
  source = new EventSource(`events${q ? `?${q}` : ''}`);
  source.addEventListener('view', (ev) => {
    $('conn').textContent = 'live';
    $('conn').className = 'conn live';
    render(JSON.parse(ev.data));
  });
  source.addEventListener('error', () => {
    $('conn').textContent = 'reconnecting…';
    $('conn').className = 'conn down';
  });
}

async function post(path, what) {
  say(`${what}…`);
  try {
    const r = await fetch(path, { method: 'POST', headers: { 'content-type': 'application/json' },
                                  body: '' });
    const text = await r.text();
    let body = null;
    try { body = JSON.parse(text); } catch { /* not JSON */ }
    if (!r.ok) {
      say(`${what}: ${r.status} ${body?.error?.message ?? text}`, true);
      return;
    }
    if (body && body.version && body.workers) // a rollout's report
      say(`${what}: version ${body.version.slice(0, 12)}, ${body.workers.length} workers, ` +
          `${body.failed} failed, ${body.took_ms} ms`);
    else say(`${what}: done`);
  } catch (err) {
    say(`${what}: ${err.message}`, true);
  }
}

async function showTail(address) {
  $('tail-address').textContent = address;
  $('tail-box').hidden = false;
  $('tail').textContent = 'loading…';
  try {
    const r = await fetch(`status/tail?address=${encodeURIComponent(address)}`);
    const text = await r.text();
    $('tail').textContent = text || '(no output kept for this address: see its kind log)';
  } catch (err) {
    $('tail').textContent = err.message;
  }
}

document.addEventListener('click', (ev) => {
  const b = ev.target.closest('button');
  if (!b) return;
  if (b.dataset.op) {
    const { op, address } = b.dataset;
    // Retry starts the worker again at once (?start=1) instead of waiting for a request.
    const suffix = op === 'retry' ? '?start=1' : '';
    post(`workers/${encodeURIComponent(address)}/${op}${suffix}`, `${op} ${address}`);
  } else if (b.dataset.rollout) {
    post(`workers/kinds/${encodeURIComponent(b.dataset.rollout)}/rollout`,
         `rollout of ${b.dataset.rollout}`);
  } else if (b.dataset.tail) {
    showTail(b.dataset.tail);
  } else if (b.id === 'prev' && page > 0) {
    page -= 1;
    connect();
  } else if (b.id === 'next') {
    page += 1;
    connect();
  } else if (b.id === 'tail-close') {
    $('tail-box').hidden = true;
  }
});

let typing = null;
form.addEventListener('input', () => {
  clearTimeout(typing);
  typing = setTimeout(() => { page = 0; connect(); }, 300);
});
form.addEventListener('submit', (ev) => ev.preventDefault());

// Ages move on without a view.
setInterval(() => {
  for (const e of document.querySelectorAll('[data-since]')) e.textContent = age(Number(e.dataset.since));
}, 1000);

{
  const q = new URLSearchParams(location.search);
  for (const name of ['q', 'status']) form.elements[name].value = q.get(name) ?? '';
  const kind = q.get('kind');
  if (kind) form.elements.kind.append(el('option', { value: kind }, kind));
  form.elements.kind.value = kind ?? '';
  page = Number(q.get('page')) || 0;
  per = Number(q.get('per')) || 50;
}
connect();
