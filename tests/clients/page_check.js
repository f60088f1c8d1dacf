// Opens the admin operator page (GET /) in headless Chromium and checks that it shows live data.
//
// Usage: node page_check.js --url URL --screenshot PATH --rule DOMAIN/RULE [--key KEYTEXT]
//                           [--candidate DOMAIN/RULE/NAME] [--regions A,B,C] [--timeout-ms 20000]
// Waits, within the timeout, until
//   1. the `rules` table has a row data-rule=DOMAIN/RULE whose decisions/s cell is a number
//      (so the page has polled twice and computed a rate);
//   2. (with --key) the `top-keys` table shows KEYTEXT;
//   3. (with --candidate) the `candidates` row data-candidate=DOMAIN/RULE/NAME shows a
//      would-deny total above 0;
//   4. (with --regions) the `region-buckets` table has a row showing a lease for each region.
// Then it saves a full-page screenshot to PATH, prints one JSON line (the rows it read and the
// page's first-render time) and exits 0. It exits 1, naming the check, on a timeout, and also
// when the page logged any console error or threw. The browser is Debian's Chromium
// (/usr/bin/chromium, or $CHROMIUM); playwright-core gives it a fresh temporary profile
// (user-data-dir) of its own and removes it on close.
'use strict';

const { chromium } = require('playwright-core');

const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

function parseArgs(argv) {
  const opts = { timeoutMs: 20000 };
  const names = { '--url': 'url', '--screenshot': 'screenshot', '--rule': 'rule', '--key': 'key',
    '--candidate': 'candidate', '--regions': 'regions', '--timeout-ms': 'timeoutMs' };
  for (let i = 0; i < argv.length; i += 2) {
    const name = names[argv[i]];
    if (!name || i + 1 >= argv.length) usage(`bad argument: ${argv[i]}`);
    opts[name] = name === 'timeoutMs' ? Number(argv[i + 1]) : argv[i + 1];
  }
  for (const name of ['url', 'screenshot', 'rule']) {
    if (!opts[name]) usage(`missing --${name}`);
  }
  if (!(opts.timeoutMs > 0)) usage('--timeout-ms must be a positive number');
  return opts;
}

function usage(message) {
  console.error(`page_check: ${message}\nusage: node page_check.js --url URL --screenshot PATH `
    + '--rule DOMAIN/RULE [--key KEYTEXT] [--candidate DOMAIN/RULE/NAME] [--regions A,B] '
    + '[--timeout-ms 20000]');
  process.exit(2);
}

// Runs in the page: each returns { ok, why, ...what it read }.
function readRule(rule) {
  const cells = (tr) => Object.fromEntries([...tr.cells].map((c) => [c.dataset.col, c.textContent.trim()]));
  const table = document.getElementById('rules');
  if (!table) return { ok: false, why: 'no table#rules on the page' };
  const row = [...table.querySelectorAll('tbody tr[data-rule]')].find((tr) => tr.dataset.rule === rule);
  if (!row) return { ok: false, why: `no row data-rule="${rule}" in #rules (${table.tBodies[0].rows.length} rows)` };
  const got = cells(row);
  if (!/^[0-9][0-9,]*(\.[0-9]+)?$/.test(got.decisions_s || '')) {
    return { ok: false, why: `decisions/s of ${rule} is "${got.decisions_s}", not a number yet` };
  }
  const first = window.__firstRenderMs ?? Number(document.body.dataset.firstRenderMs);
  return { ok: true, row: got, first_render_ms: typeof first === 'number' && isFinite(first) ? first : null };
}

function readTopKey(key) {
  const cells = (tr) => Object.fromEntries([...tr.cells].map((c) => [c.dataset.col, c.textContent.trim()]));
  const table = document.getElementById('top-keys');
  if (!table) return { ok: false, why: 'no table#top-keys on the page' };
  const rows = [...table.tBodies[0].rows];
  const row = rows.find((tr) => tr.querySelector('[data-col=key]')?.textContent.trim() === key)
    || rows.find((tr) => tr.textContent.includes(key));
  if (!row) return { ok: false, why: `#top-keys (${rows.length} rows) does not show "${key}"` };
  return { ok: true, row: { data_rule: row.dataset.rule ?? null, ...cells(row) } };
}

function readCandidate(candidate) {
  const cells = (tr) => Object.fromEntries([...tr.cells].map((c) => [c.dataset.col, c.textContent.trim()]));
  const table = document.getElementById('candidates');
  if (!table) return { ok: false, why: 'no table#candidates on the page' };
  const row = [...table.querySelectorAll('tbody tr[data-candidate]')].find((tr) => tr.dataset.candidate === candidate);
  if (!row) return { ok: false, why: `no row data-candidate="${candidate}" in #candidates` };
  const got = cells(row);
  const would = parseFloat(String(got.would_deny || '').replace(/,/g, ''));
  if (!(would > 0)) return { ok: false, why: `would deny total of ${candidate} is "${got.would_deny}", not above 0` };
  return { ok: true, row: got, flagged: row.classList.contains('flag') };
}

function readRegions(names) {
  const table = document.getElementById('region-buckets');
  if (!table) return { ok: false, why: 'no table#region-buckets on the page' };
  if (document.getElementById('regions').hidden) return { ok: false, why: 'the regions section is hidden' };
  const rows = [...table.tBodies[0].rows].filter((tr) => tr.dataset.bucket);
  const row = rows.find((tr) => names.every((name) => tr.querySelector(`[data-region="${name}"]`)));
  if (!row) return { ok: false, why: `no row of #region-buckets (${rows.length} rows) shows ${names.join(', ')}` };
  const leases = Object.fromEntries(names.map((name) => {
    const text = row.querySelector(`[data-region="${name}"]`).textContent.trim();
    return [name, text];
  }));
  return { ok: true, row: { bucket: row.dataset.bucket, leases, note: document.getElementById('regions-note').textContent } };
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const deadline = Date.now() + opts.timeoutMs;
  const left = () => Math.max(1, deadline - Date.now());
  // A last guard, should Chromium hang where no playwright timeout reaches.
  setTimeout(() => { console.error('page_check: FAIL: hard timeout'); process.exit(1); }, opts.timeoutMs + 30000).unref();

  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ARGS,
    timeout: 30000,
  });
  let failure = null;
  const consoleErrors = [];
  try {
    const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => consoleErrors.push(`uncaught: ${e.message}`));
    const started = Date.now();
    const response = await page.goto(opts.url, { waitUntil: 'load', timeout: left() });
    if (!response || !response.ok()) throw new Error(`GET ${opts.url}: ${response ? response.status() : 'no response'}`);

    const checks = [
      ['rules row with a decisions/s rate', readRule, opts.rule],
      ['top-keys shows the key', readTopKey, opts.key],
      ['candidate row with would-deny > 0', readCandidate, opts.candidate],
      ['a global bucket with every region\'s lease', readRegions, opts.regions && opts.regions.split(',')],
    ].filter(([, , arg]) => arg);
    const read = {};
    for (const [name, fn, arg] of checks) {
      let got = { ok: false, why: 'not checked yet' };
      for (;;) {
        got = await page.evaluate(fn, arg);
        if (got.ok || Date.now() >= deadline) break;
        await page.waitForTimeout(Math.min(200, left()));
      }
      if (!got.ok) {
        failure = `timed out after ${opts.timeoutMs} ms waiting for: ${name}: ${got.why}`;
        break;
      }
      read[fn.name] = got;
    }
    await page.screenshot({ path: opts.screenshot, fullPage: true, timeout: 30000 });
    if (consoleErrors.length) {
      failure = `${failure ? `${failure}\n` : ''}the page logged errors:\n  ${consoleErrors.join('\n  ')}`;
    }
    if (failure) return failure;
    console.log(JSON.stringify({
      url: opts.url,
      screenshot: opts.screenshot,
      load_ms: read.readRule.first_render_ms,
      checks_ms: Date.now() - started,
      rule: { data_rule: opts.rule, ...read.readRule.row },
      top_key: read.readTopKey?.row ?? null,
      candidate: read.readCandidate
        ? { data_candidate: opts.candidate, flagged: read.readCandidate.flagged, ...read.readCandidate.row }
        : null,
      regions: read.readRegions?.row ?? null,
      console_errors: consoleErrors,
    }));
    return null;
  } finally {
    await browser.close();
  }
}

main().then((failure) => {
  if (failure) {
    console.error(`page_check: FAIL: ${failure}`);
    process.exit(1);
  }
  process.exit(0);
}, (err) => {
  console.error(`page_check: FAIL: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
