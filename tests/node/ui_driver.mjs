// ui_driver.mjs -- drives the web dashboard in Debian's Chromium (playwright-core) against a real moatd
// and prints one JSON object: what each scenario saw, for tests/integration/test_ui.py to judge.
//
// Environment: MOAT_UI_URL (http://127.0.0.1:PORT), MOAT_UI_ADMIN_KEY, MOAT_UI_READONLY_KEY,
// MOAT_UI_SANDBOX (a running sandbox of the admin's org), MOAT_UI_OTHER (another org's sandbox),
// MOAT_UI_SHOTS (directory for screenshots), MOAT_UI_UPLOAD (a file to upload to /root),
// MOAT_UI_DOWNLOAD (where to save it downloaded again).
import net from 'node:net';
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

  await step('keyboard', async () => {
    // by keyboard alone: Tab reaches Create (every stop with a visible focus ring), Enter creates,
    // Enter on a row's Kill kills, Enter on a nav link opens its page
    const kc = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await kc.newPage();
    await signIn(p, env.MOAT_UI_ADMIN_KEY);
    const stops = [];
    let onCreate = false;
    for (let i = 0; i < 60 && !onCreate; i++) {
      await p.keyboard.press('Tab');
      const f = await p.evaluate(() => {
        const el = document.activeElement;
        const st = getComputedStyle(el);
        return { tag: el.tagName.toLowerCase(), id: el.id, text: (el.textContent || '').trim().slice(0, 30),
          ring: st.outlineStyle !== 'none' && parseFloat(st.outlineWidth) > 0 };
      });
      stops.push(f);
      onCreate = f.id === 'create';
    }
    const before = await p.$$eval('#sandbox-rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    await p.keyboard.press('Enter');
    const created = await (await p.waitForFunction((b) => {
      const r = [...document.querySelectorAll('#sandbox-rows tr[data-id]')].find((x) => !b.includes(x.dataset.id));
      return r ? r.dataset.id : null;
    }, before, { timeout: 30000 })).jsonValue();
    await p.focus(`tr[data-id="${created}"] button.kill`);
    await p.keyboard.press('Enter');
    await p.waitForSelector(`tr[data-id="${created}"]`, { state: 'detached', timeout: 30000 });
    await p.focus('#nav a[href="#/usage"]');
    await p.keyboard.press('Enter');
    await p.waitForSelector('#list-usage[data-loaded="1"]', { timeout: 15000 });
    await kc.close();
    return { stops, on_create: onCreate, created };
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
    const statuses = [];
    const disabled = [];
    for (const [action, want] of [['pause', 'paused'], ['resume', 'running'], ['hibernate', 'hibernated'], ['wake', 'running']]) {
      await page.waitForSelector(`#actions button[data-action="${action}"]`, { timeout: 15000 });
      const t0 = Date.now();
      await page.click(`#actions button[data-action="${action}"]`);
      await page.waitForFunction((w) => document.getElementById('state')?.textContent === w, want, { timeout: 30000 });
      t[action] = Date.now() - t0;
      seen.push(await page.textContent('#state'));
      // the action's status: its seconds once done, and the buttons usable again
      await page.waitForFunction(() => !document.querySelector('.status[role=status][data-running]'), null, { timeout: 30000 });
      statuses.push(await page.textContent('.status[role=status]'));
      disabled.push(await page.$$eval('#actions button:disabled', (bs) => bs.length));
    }
    return { seen, ms: t, statuses, disabled };
  });

  await step('timetravel', async () => {
    await page.waitForSelector('#actions button[data-action="snapshots"]', { timeout: 15000 });
    await page.click('#actions button[data-action="snapshots"]');
    const snap = await (await page.waitForFunction(() => document.querySelector('.status[role=status][data-snapshot]')?.dataset.snapshot, null, { timeout: 30000 })).jsonValue();
    await page.waitForSelector(`#rollback-to option[value="${snap}"]`, { state: 'attached' });
    await page.selectOption('#rollback-to', snap);
    await page.click('#actions button[data-action="rollback"]');
    await page.waitForFunction((x) => document.querySelector('.status[role=status]')?.textContent.startsWith(`rolled back to ${x} (`), snap, { timeout: 30000 });
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
    // the chart: its range and bucket, and per line the points it drew (from the SVG's attributes)
    const chart = async (metric) => {
      await page.waitForSelector(`#usage-chart[data-loaded="1"][data-group="metadata.owner"][data-metric="${metric}"]`, { timeout: 15000 });
      return page.$eval('#usage-chart', (c) => ({
        ...c.dataset,
        lines: [...c.querySelectorAll('svg polyline')].map((l) => ({
          name: l.dataset.series, points: Number(l.dataset.points),
          times: l.dataset.times.split(',').map(Number), values: l.dataset.values.split(',').map(Number),
          color: l.style.stroke,
        })),
        legend: [...c.querySelectorAll('#usage-legend li')].map((li) => li.dataset.series),
        ticks: [...c.querySelectorAll('svg text.axis')].map((t) => t.textContent),
        svg_width: c.querySelector('svg')?.getBoundingClientRect().width || 0,
      }));
    };
    const cpu = await chart('cpu_seconds');
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/usage.png` });
    // keyboard: the metric selector follows the range, the chart follows the Show button
    await page.focus('#usage-range');
    await page.keyboard.press('Tab');
    const after_range = await page.evaluate(() => document.activeElement.id);
    await page.focus('#usage-go');
    await page.keyboard.press('Tab');
    const after_go = await page.evaluate(() => document.activeElement.id);
    await page.selectOption('#usage-metric', 'sandbox_seconds');
    const alive = await chart('sandbox_seconds');
    // phone width: the chart redraws to fit
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForFunction(() => {
      const s = document.querySelector('#usage-chart svg');
      return s && s.getBoundingClientRect().width <= 390;
    }, null, { timeout: 5000 });
    const phone = { overflow: await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth),
      svg_width: await page.$eval('#usage-chart svg', (s) => s.getBoundingClientRect().width),
      viewbox: await page.$eval('#usage-chart svg', (s) => s.getAttribute('viewBox')) };
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/usage-phone.png` });
    await page.setViewportSize({ width: 1280, height: 800 });
    return { rows, cpu, alive, keyboard: { after_range, after_go }, phone, at_ms: Date.now() };
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

  // -- templates built from the page (log followed live, failure, delete, readonly), a database's
  // branch and its events panel --
  await step('template_build', async () => {
    const s0 = Date.now();
    await page.goto(`${URL}/ui/#/templates`);
    await page.waitForSelector('#list-templates[data-loaded="1"]');
    await page.fill('#tpl-name', 'ui-tpl');
    await page.fill('#tpl-dockerfile', 'FROM base\nCOPY greeting.txt /ui-greeting.txt\n'
      + 'RUN echo ui-build-one && sleep 2 && echo ui-made > /ui-built.txt && echo ui-build-two\n');
    await page.setInputFiles('#tpl-files', { name: 'greeting.txt', mimeType: 'text/plain', buffer: Buffer.from('hello from the page\n') });
    // every log line as it is added: the build state the page showed then, and which batch of DOM
    // changes added it (lines rendered as they arrive come in separate batches)
    await page.evaluate(() => {
      window.uiTplSeen = [];
      let batch = 0;
      new MutationObserver((recs) => {
        const st = document.getElementById('tpl-build-state').textContent;
        batch++;
        for (const r of recs) for (const n of r.addedNodes) if (n.classList && n.classList.contains('line')) window.uiTplSeen.push([n.textContent, st, batch]);
      }).observe(document.getElementById('tpl-build-log'), { childList: true });
    });
    const t0 = Date.now();
    await page.press('#tpl-name', 'Enter');
    await page.waitForSelector('#tpl-build-panel:not([data-state="building"])[data-state]', { timeout: 180000 });
    const buildMs = Date.now() - t0;
    const state = await page.getAttribute('#tpl-build-panel', 'data-state');
    const buildId = await page.getAttribute('#tpl-build-panel', 'data-build');
    const lines = await page.$$eval('#tpl-build-log .line', (ls) => ls.map((l) => [Number(l.dataset.step), l.dataset.stream, l.textContent]));
    const seen = await page.evaluate(() => window.uiTplSeen);
    const elapsed = await page.textContent('#tpl-build-elapsed');
    await page.waitForSelector('#list-templates tr[data-id="ui-tpl"][data-state="ready"]', { timeout: 15000 });
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/templates.png` });
    // the sandboxes page offers it to create from
    await page.goto(`${URL}/ui/#/sandboxes`);
    await page.waitForSelector('#create-template option[value="ui-tpl"]', { state: 'attached', timeout: 15000 });
    // its detail page: the fields and the last build's log; New sandbox makes one from it
    await page.goto(`${URL}/ui/#/templates/ui-tpl`);
    await page.waitForSelector('#tpl-log[data-loaded="1"]', { timeout: 15000 });
    const facts = await page.$$eval('#tpl-details dd', (ds) => Object.fromEntries(ds.map((d) => [d.dataset.fact, d.textContent])));
    const detailLines = await page.$$eval('#tpl-log .line', (ls) => ls.map((l) => [Number(l.dataset.step), l.dataset.stream, l.textContent]));
    await page.click('#tpl-new-sandbox');
    await page.waitForFunction(() => /^#\/sandboxes\/sb-/.test(location.hash), null, { timeout: 30000 });
    const made = decodeURIComponent(await page.evaluate(() => location.hash.split('/').pop()));
    await page.waitForSelector('#state');
    return { state, build_id: buildId, lines, seen, elapsed, facts, detail_lines: detailLines, sandbox: made, build_ms: buildMs, step_ms: Date.now() - s0 };
  });

  await step('template_fail', async () => {
    const s0 = Date.now();
    await page.goto(`${URL}/ui/#/templates`);
    await page.waitForSelector('#list-templates[data-loaded="1"]');
    await page.fill('#tpl-name', 'ui-tpl-bad');
    await page.fill('#tpl-dockerfile', 'FROM base\nRUN echo ui-about-to-fail && false\n');
    await page.click('#tpl-build');
    await page.waitForSelector('#tpl-build-panel:not([data-state="building"])[data-state]', { timeout: 120000 });
    const state = await page.getAttribute('#tpl-build-panel', 'data-state');
    await page.waitForSelector('#error:not([hidden])');
    const errorText = await page.textContent('#error');
    const apiError = await page.evaluate(async () => (await (await fetch('/v1/templates/ui-tpl-bad')).json()).error);
    const lines = await page.$$eval('#tpl-build-log .line', (ls) => ls.map((l) => l.textContent));
    await page.waitForSelector('#list-templates tr[data-id="ui-tpl-bad"]');
    // from its row to its detail page by keyboard, then Delete
    await page.focus('#list-templates tr[data-id="ui-tpl-bad"] a.tpl-link');
    await page.keyboard.press('Enter');
    await page.waitForSelector('#tpl-log[data-loaded="1"]', { timeout: 15000 });
    const detailError = await page.textContent('#tpl-details dd[data-fact="error"]');
    // a second tab on the same page: its Delete comes after this one's and gets the API's refusal
    const stale = await ctx.newPage();
    await stale.goto(`${URL}/ui/#/templates/ui-tpl-bad`);
    await stale.waitForSelector('#tpl-delete');
    await page.click('#tpl-delete');
    await page.waitForFunction(() => location.hash === '#/templates');
    await page.waitForSelector('#list-templates[data-loaded="1"]');
    const rows = await page.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    await stale.click('#tpl-delete');
    await stale.waitForSelector('#error:not([hidden])');
    const staleError = await stale.textContent('#error');
    const staleHash = await stale.evaluate(() => location.hash);
    await stale.close();
    // moatd's own template: no Delete button
    await page.goto(`${URL}/ui/#/templates/base`);
    await page.waitForSelector('#tpl-details[data-loaded="1"]');
    const baseDelete = await page.$$eval('#tpl-delete', (b) => b.length);
    return { state, error_text: errorText, api_error: apiError, lines, detail_error: detailError, rows, base_delete: baseDelete,
      stale_error: staleError, stale_hash: staleHash, step_ms: Date.now() - s0 };
  });

  await step('db_branch_events', async () => {
    const s0 = Date.now();
    // a database that hibernates after 2 s without a connection, made through the API
    const db = await page.evaluate(async () => {
      const r = await fetch('/v1/databases', { method: 'POST', headers: { 'X-Moat-UI': '1', 'Content-Type': 'application/json' },
        body: JSON.stringify({ name: 'ui-src', size_mb: 64, idle_seconds: 2 }) });
      const j = await r.json();
      if (r.status !== 201) throw new Error(`create: ${r.status} ${j.message}`);
      return j;
    });
    await page.goto(`${URL}/ui/#/databases`);
    await page.waitForSelector(`#list-databases tr[data-id="${db.id}"]`, { timeout: 15000 });
    await page.click(`tr[data-id="${db.id}"] button.events`);
    await page.waitForSelector('#db-events-log .event[data-type="state"]', { timeout: 15000 });
    await page.click(`tr[data-id="${db.id}"] button.branch`);
    await page.fill('#db-branch-name', 'ui-branch');
    const t0 = Date.now();
    await page.press('#db-branch-name', 'Enter');
    await page.waitForSelector('#list-databases tr[data-name="ui-branch"]', { timeout: 90000 });
    const branchMs = Date.now() - t0;
    const branchId = await page.$eval('#list-databases tr[data-name="ui-branch"]', (r) => r.dataset.id);
    // the row can show (a refresh the branch's event set off) before the POST's answer sets the status
    await page.waitForFunction(() => /^branched /.test(document.querySelector('.status[role=status]')?.textContent || ''), null, { timeout: 90000 });
    const status = await page.textContent('.status[role=status]');
    await page.waitForSelector('#db-events-log .event[data-type="branched"]', { timeout: 30000 });
    // idle: moatd hibernates it, and the panel says so as it happens
    await page.waitForSelector('#db-events-log .event[data-type="hibernated"]', { timeout: 90000 });
    await page.waitForSelector(`tr[data-id="${db.id}"][data-state="hibernated"]`, { timeout: 15000 });
    // a client's connection (a PostgreSQL startup packet to the host's listener) wakes it
    const u = new globalThis.URL(db.connection.url);
    const answered = await new Promise((resolve, reject) => {
      const sock = net.connect(Number(u.port), u.hostname, () => {
        const kv = Buffer.from(`user\0${decodeURIComponent(u.username)}\0database\0${u.pathname.slice(1)}\0\0`);
        const msg = Buffer.alloc(8 + kv.length);
        msg.writeUInt32BE(msg.length, 0);
        msg.writeUInt32BE(196608, 4);
        kv.copy(msg, 8);
        sock.write(msg);
      });
      sock.setTimeout(60000, () => { sock.destroy(); reject(new Error('no answer to the startup packet')); });
      sock.once('data', (d) => { sock.destroy(); resolve(String.fromCharCode(d[0])); });
      sock.once('error', reject);
    });
    await page.waitForSelector('#db-events-log .event[data-type="woken"]', { timeout: 60000 });
    const events = await page.$$eval('#db-events-log .event', (es) => es.map((e) => [e.dataset.type, e.textContent]));
    await page.click('#db-events-close');
    return { id: db.id, branch_id: branchId, status, events, answered, branch_ms: branchMs, step_ms: Date.now() - s0 };
  });

  await step('templates_readonly', async () => {
    const s0 = Date.now();
    const ro = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await ro.newPage();
    await signIn(p, env.MOAT_UI_READONLY_KEY);
    await p.goto(`${URL}/ui/#/templates`);
    await p.waitForSelector('#list-templates[data-loaded="1"]');
    const form = await p.$$eval('#tpl-form', (f) => f.length);
    const rows = await p.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    await p.goto(`${URL}/ui/#/templates/ui-tpl`);
    await p.waitForSelector('#tpl-log[data-loaded="1"]', { timeout: 15000 });
    const del = await p.$$eval('#tpl-delete', (b) => b.length);
    const create = await p.$$eval('#tpl-new-sandbox', (b) => b.length);
    const logLines = await p.$$eval('#tpl-log .line', (ls) => ls.length);
    await p.goto(`${URL}/ui/#/databases`);
    await p.waitForSelector('#list-databases[data-loaded="1"]');
    const branch = await p.$$eval('#list-databases button.branch', (b) => b.length);
    const evButtons = await p.$$eval('#list-databases button.events', (b) => b.length);
    // phone width: the build form and a template's page stay within the screen
    await p.close();
    await ro.close();
    await page.setViewportSize({ width: 390, height: 844 });
    const overflow = {};
    for (const [k, hash, sel] of [['templates', '#/templates', '#list-templates[data-loaded="1"]'],
      ['template', '#/templates/ui-tpl', '#tpl-log[data-loaded="1"]'], ['databases', '#/databases', '#list-databases[data-loaded="1"]']]) {
      await page.goto(`${URL}/ui/${hash}`);
      await page.waitForSelector(sel, { timeout: 15000 });
      overflow[k] = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    }
    await page.setViewportSize({ width: 1280, height: 800 });
    return { form, rows, delete: del, new_sandbox: create, log_lines: logLines, branch, events_buttons: evButtons, overflow, step_ms: Date.now() - s0 };
  });

  await step('quotas_host', async () => {
    await page.goto(`${URL}/ui/#/quotas`);
    await page.waitForSelector('#list-quotas[data-loaded="1"]');
    const quotas = await page.$$eval('#rows tr[data-id]', (rs) => rs.map((r) => [r.dataset.id, r.dataset.use, r.dataset.limit]));
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/quotas.png` });
    await page.goto(`${URL}/ui/#/host`);
    await page.waitForSelector('#host[data-loaded="1"]');
    const facts = await page.$$eval('#host dd', (ds) => Object.fromEntries(ds.map((d) => [d.dataset.fact, d.textContent])));
    const scope = await page.$eval('#host', (d) => d.dataset.scope);
    await page.screenshot({ path: `${env.MOAT_UI_SHOTS}/host.png` });
    return { quotas, facts, scope };
  });

  await step('platform', async () => {
    // the platform admin key: orgs and the host only; an org made, its quotas edited and it deleted
    const pc = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const p = await pc.newPage();
    await p.goto(`${URL}/ui/`);
    await p.waitForSelector('#signin');
    await p.fill('#key', env.MOAT_UI_PLATFORM_KEY);
    await p.press('#key', 'Enter');
    await p.waitForSelector('#list-orgs[data-loaded="1"]', { timeout: 15000 });
    const nav = await p.$$eval('#nav a', (as) => as.map((a) => a.getAttribute('href')));
    const orgs = await p.$$eval('#list-orgs tr[data-id]', (rs) => rs.map((r) => r.dataset.id));
    await p.fill('#org-name', env.MOAT_UI_NEW_ORG);
    await p.press('#org-name', 'Enter'); // by keyboard
    await p.waitForSelector('#org-secret:not([hidden]) #org-key');
    const made = await p.$eval('#org-secret', (d) => d.dataset.org);
    const key = await p.$eval('#org-key', (c) => c.textContent);
    const row = `#list-orgs tr[data-id="${made}"]`;
    await p.waitForSelector(row);
    await p.click(`${row} button[data-act="quotas"]`);
    await p.waitForSelector('#edit-quotas[data-loaded="1"]');
    await p.fill('#quota-editor input[data-quota="max_sandboxes"]', '3');
    await p.fill('#quota-editor input[data-quota="max_memory_mb"]', '2048');
    await p.click('#quotas-save');
    await p.waitForSelector('#quota-editor[data-saved="1"] #edit-quotas[data-loaded="1"]');
    const saved = await p.$$eval('#edit-quotas tr[data-id]', (rs) => Object.fromEntries(rs.map((r) => [r.dataset.id, r.dataset.limit])));
    const quotas = await p.evaluate(async (id) => (await fetch(`/v1/orgs/${id}/quotas`)).json(), made);
    await p.screenshot({ path: `${env.MOAT_UI_SHOTS}/orgs.png` });
    // a limit over the API's 2^53: its message
    await p.fill('#quota-editor input[data-quota="max_sandboxes"]', '100000000000000000');
    await p.click('#quotas-save');
    await p.waitForSelector('#error:not([hidden])');
    const bad = await p.$eval('#error', (e) => e.textContent);
    await p.goto(`${URL}/ui/#/host`);
    await p.waitForSelector('#host[data-loaded="1"]');
    const facts = await p.$$eval('#host dd', (ds) => Object.fromEntries(ds.map((d) => [d.dataset.fact, d.textContent])));
    const scope = await p.$eval('#host', (d) => d.dataset.scope);
    await p.screenshot({ path: `${env.MOAT_UI_SHOTS}/host-platform.png` });
    await p.goto(`${URL}/ui/#/orgs`);
    await p.waitForSelector(row);
    await p.click(`${row} button[data-act="delete"]`);
    await p.waitForSelector(row, { state: 'detached', timeout: 15000 });
    // an org page's URL takes the platform key nowhere but the orgs
    await p.goto(`${URL}/ui/#/sandboxes`);
    await p.waitForSelector('#list-orgs[data-loaded="1"]');
    await pc.close();
    return { nav, orgs, made, key, saved, quotas, bad, facts, scope };
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
