// ui_driver.mjs -- drives the web dashboard in Debian's Chromium (playwright-core) against a real moatd
// and prints one JSON object: what each scenario saw, for tests/integration/test_ui.py to judge.
//
// Environment: MOAT_UI_URL (http://127.0.0.1:PORT), MOAT_UI_ADMIN_KEY, MOAT_UI_READONLY_KEY,
// MOAT_UI_SANDBOX (a running sandbox of the admin's org), MOAT_UI_OTHER (another org's sandbox),
// MOAT_UI_SHOTS (directory for screenshots), MOAT_UI_UPLOAD (a file to upload to /root),
// MOAT_UI_DOWNLOAD (where to save it downloaded again).
import { chromium } from 'playwright-core';

const env = process.env;
const URL = env.MOAT_UI_URL;
const SB = env.MOAT_UI_SANDBOX;
const out = {};

function step(name, fn) {
  return fn().then(
    (v) => { out[name] = { ok: true, ...v }; },
    (e) => { out[name] = { ok: false, error: String(e && e.stack ? e.stack : e) }; });
}

async function signIn(page, key) {
  await page.goto(`${URL}/ui/`);
  await page.waitForSelector('#signin');
  await page.fill('#key', key);
  await page.press('#key', 'Enter'); // by keyboard
  await page.waitForSelector('#sandboxes[data-loaded="1"]', { timeout: 15000 });
}

async function termText(page) {
  return page.$eval('#terminal .xterm-rows', (el) => el.innerText);
}

async function waitTerm(page, re, timeout = 15000) {
  const deadline = Date.now() + timeout;
  let last = '';
  while (Date.now() < deadline) {
    last = await termText(page);
    if (re.test(last)) return last;
    await page.waitForTimeout(100);
  }
  throw new Error(`terminal never matched ${re}: ${JSON.stringify(last.slice(-400))}`);
}

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
  // a fresh --user-data-dir: playwright-core makes one per launch (and refuses the flag itself)
});
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await ctx.newPage();
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });

  await step('bad_key', async () => {
    await page.goto(`${URL}/ui/`);
    await page.waitForSelector('#signin');
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/signin.png` });
    await page.fill('#key', 'moat_not_a_key');
    await page.click('#signin button[type=submit]');
    await page.waitForSelector('#error:not([hidden])');
    return { error_text: await page.textContent('#error') };
  });

  await step('list', async () => {
    const t0 = Date.now();
    await signIn(page, env.MOAT_UI_ADMIN_KEY);
    const signInMs = Date.now() - t0;
    await page.waitForSelector(`tr[data-id="${SB}"]`);
    const ids = await page.$$eval('#sandbox-rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    const state = await page.$eval(`tr[data-id="${SB}"]`, (r) => r.dataset.state);
    const cookies = await ctx.cookies();
    const c = cookies.find((x) => x.name === 'moat_ui') || {};
    const jsCookie = await page.evaluate(() => document.cookie);
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/sandboxes.png` });
    return { sign_in_to_list_ms: signInMs, ids, state, cookie: { httpOnly: c.httpOnly, sameSite: c.sameSite, expires: c.expires }, js_cookie: jsCookie };
  });

  await step('create_kill', async () => {
    const before = await page.$$eval('#sandbox-rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    await page.click('#create');
    const row = await page.waitForFunction((b) => {
      const r = [...document.querySelectorAll('#sandbox-rows tr[data-id]')].find((x) => !b.includes(x.dataset.id));
      return r ? r.dataset.id : null;
    }, before, { timeout: 30000 });
    const created = await row.jsonValue();
    await page.click(`tr[data-id="${created}"] button.kill`);
    await page.waitForSelector(`tr[data-id="${created}"]`, { state: 'detached', timeout: 30000 });
    return { created };
  });

  await step('bulk', async () => {
    const want = env.MOAT_UI_BULK.split(',');
    const rowIds = () => page.$$eval('#sandbox-rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id).sort());
    const waitRows = async (ids) => {
      await page.waitForFunction((w) => {
        const got = [...document.querySelectorAll('#sandbox-rows tr[data-id]')].map((r) => r.dataset.id).sort();
        return JSON.stringify(got) === JSON.stringify(w);
      }, [...ids].sort(), { timeout: 30000 });
    };
    await page.fill('#meta-filter', 'batch=ui-bulk');
    await page.press('#meta-filter', 'Enter');
    await waitRows(want);
    const byMeta = await rowIds();
    await page.selectOption('#template-filter', 'code-interpreter');
    await waitRows([]);
    await page.selectOption('#template-filter', 'base');
    await waitRows(want);
    for (const id of want) await page.check(`tr[data-id="${id}"] input.select`);
    const label = await page.textContent('#kill-selected');
    await page.click('#kill-selected');
    await waitRows([]);
    const status = await page.textContent('.status[role=status]');
    await page.fill('#meta-filter', '');
    await page.press('#meta-filter', 'Enter');
    await page.selectOption('#template-filter', '');
    await page.waitForSelector(`tr[data-id="${SB}"]`);
    return { by_meta: byMeta, label, status };
  });

  await step('sandbox_page', async () => {
    await page.goto(`${URL}/ui/#/sandboxes/${SB}`);
    await page.waitForSelector('#state');
    const state = await page.textContent('#state');
    const actions = await page.$$eval('#actions button', (bs) => bs.map((b) => b.dataset.action));
    return { state, actions };
  });

  await step('files', async () => {
    await page.waitForSelector('#files[data-dir="/root"]', { timeout: 15000 });
    await page.setInputFiles('#files-upload', env.MOAT_UI_UPLOAD);
    const name = env.MOAT_UI_UPLOAD.split('/').pop();
    await page.waitForSelector(`#files-rows tr[data-name="${name}"]`, { timeout: 30000 });
    const [dl] = await Promise.all([
      page.waitForEvent('download'),
      page.click(`#files-rows tr[data-name="${name}"] a.download`),
    ]);
    await dl.saveAs(env.MOAT_UI_DOWNLOAD);
    const failure = await dl.failure();
    return { name, suggested: dl.suggestedFilename(), failure };
  });

  await step('chart', async () => {
    await page.waitForSelector('#chart polyline[data-series="cpu"]', { timeout: 20000 });
    const pts = await page.$$eval('#chart polyline', (ls) => ls.map((l) => ({
      series: l.dataset.series, n: Number(l.dataset.points), points: l.getAttribute('points') })));
    return { series: pts, samples: Number(await page.$eval('#chart', (c) => c.dataset.samples)) };
  });

  await step('terminal', async () => {
    const tc = Date.now();
    await page.click('#open-terminal');
    await page.waitForFunction(() => document.getElementById('terminal-status').textContent === 'connected');
    const connectMs = Date.now() - tc;
    await page.click('#terminal');
    const te = Date.now();
    await page.keyboard.type('echo ui$((6*7))\n');
    await waitTerm(page, /ui42/);
    const echoMs = Date.now() - te;
    // resize: the page shrinks, the terminal follows, the pty reports the new size
    await page.setViewportSize({ width: 900, height: 700 });
    await page.waitForTimeout(500);
    const cols = await page.$eval('#terminal', (t) => Number(t.dataset.cols));
    const rows = await page.$eval('#terminal', (t) => Number(t.dataset.rows));
    await page.keyboard.type('stty size\n');
    const sized = await waitTerm(page, new RegExp(`\\b${rows} ${cols}\\b`));
    // Ctrl-C: sleep 100 stops at once and the shell runs the next command
    await page.keyboard.type('sleep 100\n');
    await page.waitForTimeout(700);
    const t0 = Date.now();
    await page.keyboard.press('Control+C');
    await page.keyboard.type('echo after$((2+3))\n');
    await waitTerm(page, /after5/, 8000);
    const interruptMs = Date.now() - t0;
    await page.setViewportSize({ width: 1280, height: 800 });
    await page.waitForTimeout(300);
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/sandbox.png` });
    await page.evaluate(() => document.getElementById('terminal').scrollIntoView());
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/sandbox-terminal.png` });
    return { cols, rows, stty_seen: /\d+ \d+/.test(sized), interrupt_ms: interruptMs, connect_ms: connectMs, type_to_echo_ms: echoMs };
  });

  await step('logs', async () => {
    await page.waitForFunction(() => /ui42/.test(document.getElementById('logs').textContent), null, { timeout: 15000 });
    return { text: (await page.textContent('#logs')).slice(-2000) };
  });

  await step('actions', async () => {
    // each button, then the state the page shows once the API answered (the page polls every 3 s and
    // re-reads at once after an action)
    // a fresh page: the terminal's shell ends with its WebSocket
    await page.goto(`${URL}/ui/#/sandboxes`);
    await page.waitForSelector('#sandboxes[data-loaded="1"]');
    await page.goto(`${URL}/ui/#/sandboxes/${SB}`);
    await page.waitForSelector('#state');
    const seen = [];
    const t = {};
    for (const [action, want] of [['pause', 'paused'], ['resume', 'running'], ['hibernate', 'hibernated'], ['wake', 'running']]) {
      await page.waitForSelector(`#actions button[data-action="${action}"]`, { timeout: 15000 });
      const t0 = Date.now();
      await page.click(`#actions button[data-action="${action}"]`);
      await page.waitForFunction((w) => document.getElementById('state')?.textContent === w, want, { timeout: 30000 });
      t[action] = Date.now() - t0;
      seen.push(await page.textContent('#state'));
    }
    return { seen, ms: t };
  });

  await step('timetravel', async () => {
    await page.waitForSelector('#actions button[data-action="snapshots"]', { timeout: 15000 });
    await page.click('#actions button[data-action="snapshots"]');
    const snap = await (await page.waitForFunction(() => document.querySelector('.status[role=status][data-snapshot]')?.dataset.snapshot, null, { timeout: 30000 })).jsonValue();
    await page.waitForSelector(`#rollback-to option[value="${snap}"]`, { state: 'attached' });
    await page.selectOption('#rollback-to', snap);
    await page.click('#actions button[data-action="rollback"]');
    await page.waitForFunction((x) => document.querySelector('.status[role=status]')?.textContent === `rolled back to ${x}`, snap, { timeout: 30000 });
    await page.waitForFunction(() => document.getElementById('state')?.textContent === 'running', null, { timeout: 30000 });
    await page.click('#actions button[data-action="fork"]');
    await page.waitForFunction((sb) => /^#\/sandboxes\/sb-/.test(location.hash) && !location.hash.endsWith(sb), SB, { timeout: 30000 });
    const child = decodeURIComponent(await page.evaluate(() => location.hash.split('/').pop()));
    await page.waitForFunction(() => document.getElementById('state')?.textContent === 'running', null, { timeout: 30000 });
    const childState = await page.textContent('#state');
    await page.goto(`${URL}/ui/#/sandboxes/${SB}`);
    await page.waitForSelector('#state');
    return { snapshot: snap, child, child_state: childState };
  });

  await step('csrf', async () => {
    // the page's own cookie, without the dashboard's header: refused
    return page.evaluate(async (sb) => {
      const del = await fetch(`/v1/sandboxes/${sb}`, { method: 'DELETE' });
      const post = await fetch('/v1/sandboxes', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' });
      const get = await fetch(`/v1/sandboxes/${sb}`);
      return { del: del.status, del_body: await del.json(), post: post.status, post_body: await post.json(), get: get.status };
    }, SB);
  });

  await step('other_org', async () => {
    await page.goto(`${URL}/ui/#/sandboxes/${env.MOAT_UI_OTHER}`);
    await page.waitForSelector('#error:not([hidden])');
    return { error_text: await page.textContent('#error'), details: await page.$$eval('#details dt', (d) => d.length) };
  });

  await step('pages', async () => {
    const seen = {};
    for (const name of ['templates', 'snapshots', 'volumes', 'keys', 'audit']) {
      // reached from the navigation by keyboard: focus the link, Enter
      await page.goto(`${URL}/ui/#/sandboxes`);
      await page.waitForSelector('#sandboxes[data-loaded="1"]');
      await page.focus(`#nav a[href="#/${name}"]`);
      await page.keyboard.press('Enter');
      await page.waitForSelector(`#list-${name}[data-loaded="1"]`, { timeout: 15000 });
      seen[name] = await page.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
      if (name === 'templates') await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/${name}.png` });
      if (name === 'audit') await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/${name}.png`, clip: { x: 0, y: 0, width: 1280, height: 480 } });
    }
    return { seen };
  });

  await step('usage', async () => {
    await page.goto(`${URL}/ui/#/usage`);
    await page.waitForSelector('#list-usage[data-loaded="1"]');
    await page.fill('#usage-group', 'metadata.owner');
    await page.press('#usage-group', 'Enter');
    await page.waitForSelector('#list-usage tr[data-id="ui-test"]', { timeout: 15000 });
    const rows = await page.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => [r.dataset.id, Number(r.dataset.cpu)]));
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/usage.png` });
    return { rows, at_ms: Date.now() };
  });

  await step('databases', async () => {
    await page.goto(`${URL}/ui/#/databases`);
    await page.waitForSelector('#list-databases[data-loaded="1"]');
    await page.fill('#db-name', 'ui-db');
    await page.fill('#db-size', '64');
    const t0 = Date.now();
    await page.press('#db-name', 'Enter');
    await page.waitForSelector('#list-databases tr[data-name="ui-db"]', { timeout: 90000 });
    const createMs = Date.now() - t0;
    const id = await page.$eval('#list-databases tr[data-name="ui-db"]', (r) => r.dataset.id);
    // the row appears while the server starts (creating): a delete then is refused as busy
    await page.waitForSelector(`tr[data-id="${id}"][data-state="running"]`, { timeout: 90000 });
    const url = await page.$eval(`tr[data-id="${id}"] .url`, (c) => c.textContent);
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/databases.png` });
    // a readonly key sees the database, without its URL or a delete button
    const ro = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await ro.newPage();
    await signIn(p, env.MOAT_UI_READONLY_KEY);
    await p.goto(`${URL}/ui/#/databases`);
    await p.waitForSelector(`#list-databases tr[data-id="${id}"]`);
    const roUrl = await p.$eval(`tr[data-id="${id}"] .url`, (c) => c.textContent);
    const roDelete = await p.$$eval('#list-databases button.delete', (b) => b.length);
    const roForm = await p.$$eval('#db-form', (f) => f.length);
    await ro.close();
    await page.click(`tr[data-id="${id}"] button.delete`);
    await page.waitForSelector(`tr[data-id="${id}"]`, { state: 'detached', timeout: 30000 });
    return { id, url, ro_url: roUrl, ro_delete: roDelete, ro_form: roForm, create_ms: createMs };
  });

  await step('quotas_host', async () => {
    await page.goto(`${URL}/ui/#/quotas`);
    await page.waitForSelector('#list-quotas[data-loaded="1"]');
    const quotas = await page.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => [r.dataset.id, r.dataset.use, r.dataset.limit]));
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/quotas.png` });
    await page.goto(`${URL}/ui/#/host`);
    await page.waitForSelector('#host[data-loaded="1"]');
    const facts = await page.$$eval('#host dd', (ds) => Object.fromEntries(ds.map((d) => [d.dataset.fact, d.textContent])));
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/host.png` });
    return { quotas, facts };
  });

  await step('phone', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${URL}/ui/#/sandboxes`);
    await page.waitForSelector(`tr[data-id="${SB}"]`);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/sandboxes-phone.png` });
    await page.setViewportSize({ width: 1280, height: 800 });
    return { overflow };
  });

  await step('sign_out', async () => {
    await page.goto(`${URL}/ui/#/sandboxes`);
    await page.waitForSelector('#signout:not([hidden])');
    await page.click('#signout');
    await page.waitForSelector('#signin');
    const me = await page.evaluate(async () => (await fetch('/v1/me')).status);
    const cookies = (await ctx.cookies()).filter((x) => x.name === 'moat_ui');
    return { me, cookies: cookies.length };
  });

  await step('readonly', async () => {
    const ro = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await ro.newPage();
    await signIn(p, env.MOAT_UI_READONLY_KEY);
    await p.waitForSelector(`tr[data-id="${SB}"]`);
    const killButtons = await p.$$eval('button.kill', (b) => b.length);
    const nav = await p.$$eval('#nav a', (as) => as.map((a) => a.getAttribute('href')));
    const createButtons = await p.$$eval('#create', (b) => b.length);
    await p.goto(`${URL}/ui/#/sandboxes/${SB}`);
    await p.waitForSelector('#state');
    const actions = await p.$$eval('#actions button', (bs) => bs.length);
    // the API itself refuses the readonly key's kill, cookie and header notwithstanding
    const refused = await p.evaluate(async (sb) => {
      const r = await fetch(`/v1/sandboxes/${sb}`, { method: 'DELETE', headers: { 'X-Moat-UI': '1' } });
      return { status: r.status, body: await r.json() };
    }, SB);
    await ro.close();
    return { kill_buttons: killButtons, create_buttons: createButtons, actions, refused, nav };
  });
  await step('paging', async () => {
    // many sandboxes: made through the API from a signed-in page, then 50 a page with prev/next
    const n = Number(env.MOAT_UI_PAGING || 120);
    const pc = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await pc.newPage();
    await signIn(p, env.MOAT_UI_ADMIN_KEY);
    const t0 = Date.now();
    const made = await p.evaluate(async (count) => {
      const ids = [];
      let i = 0;
      const one = async () => {
        while (i < count) {
          const k = i++;
          const r = await fetch('/v1/sandboxes', { method: 'POST', headers: { 'X-Moat-UI': '1', 'Content-Type': 'application/json' },
            body: JSON.stringify({ template: 'base', ttl_seconds: 600, metadata: { batch: 'ui-page', n: String(k) } }) });
          const j = await r.json();
          if (r.status !== 201) throw new Error(`create ${k}: ${r.status} ${j.message}`);
          ids.push(j.id);
        }
      };
      await Promise.all([one(), one(), one(), one()]);
      return ids;
    }, n);
    const createMs = Date.now() - t0;
    // what the page asks the server for from here on: one page at a time
    const listQueries = [];
    p.on('request', (rq) => {
      const u = new globalThis.URL(rq.url());
      if (rq.method() === 'GET' && u.pathname === '/v1/sandboxes') listQueries.push(Object.fromEntries(u.searchParams));
    });
    await p.fill('#meta-filter', 'batch=ui-page');
    await p.press('#meta-filter', 'Enter');
    await p.waitForFunction((c) => document.getElementById('page-count').textContent.endsWith(`of ${c}`), n, { timeout: 15000 });
    const rowIds = () => p.$$eval('#sandbox-rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    const first = await rowIds();
    const firstCount = await p.textContent('#page-count');
    const t1 = Date.now();
    // two polls of an unchanged page: not one DOM mutation in the rows
    const mutations = await p.evaluate(() => new Promise((resolve) => {
      let m = 0;
      const obs = new MutationObserver((recs) => { m += recs.length; });
      obs.observe(document.getElementById('sandbox-rows'), { subtree: true, childList: true, characterData: true, attributes: true });
      setTimeout(() => { obs.disconnect(); resolve(m); }, 4500);
    }));
    const pages = [first];
    const counts = [firstCount];
    const prevDisabledFirst = await p.$eval('#page-prev', (b) => b.disabled);
    while (!(await p.$eval('#page-next', (b) => b.disabled))) {
      const before = await p.textContent('#page-count');
      await p.click('#page-next');
      await p.waitForFunction((b) => document.getElementById('page-count').textContent !== b, before);
      pages.push(await rowIds());
      counts.push(await p.textContent('#page-count'));
    }
    await p.click('#page-prev');
    await p.waitForFunction((c) => document.getElementById('page-count').textContent === c, counts[counts.length - 2]);
    const back = await rowIds();
    // the state filter still applies on top: none of them is paused
    await p.selectOption('#state-filter', 'paused');
    await p.waitForFunction(() => document.getElementById('page-count').textContent === '0 of 0');
    const pausedRows = await rowIds();
    await p.selectOption('#state-filter', '');
    await p.waitForFunction((c) => document.getElementById('page-count').textContent === `1–50 of ${c}`, n);
    await p.evaluate(() => document.getElementById('page-count').scrollIntoView({ block: 'end' }));
    await p.screenshot({ path: `${env.MOAT_UI_SHOTS}/sandboxes-paged.png` });
    await p.fill('#meta-filter', '');
    await p.press('#meta-filter', 'Enter');
    await pc.close();
    return { made, pages, counts, back, paused_rows: pausedRows, mutations, prev_disabled_first: prevDisabledFirst,
      list_queries: listQueries, create_ms: createMs, page_ms: Date.now() - t1 - 4500 };
  });

  out.console_errors = consoleErrors;
  await ctx.close();
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + '\n');
