// app.js -- the dashboard's shell: sign-in, the routes (#/sandboxes, #/sandboxes/ID), sign-out.
import { api, h, showError } from './api.js';
import { sandboxesPage } from './sandboxes.js';
import { sandboxPage } from './sandbox.js';
import { PAGES, listPage } from './lists.js';
import { usagePage } from './usage.js';
import { databasesPage } from './databases.js';
import { quotasPage, hostPage, orgsPage } from './admin.js';

const state = { me: null, page: null };

function main() {
  return document.getElementById('main');
}

function setSignedIn(me) {
  state.me = me;
  const nav = document.getElementById('nav');
  nav.hidden = !me;
  if (me) {
    // the platform admin key manages orgs and sees the host, nothing of an org's
    const links = me.role === 'platform' ? [['#/orgs', 'Orgs'], ['#/host', 'Host']] : [['#/sandboxes', 'Sandboxes'], ...Object.entries(PAGES)
      .filter(([, d]) => !d.admin || me.role === 'admin').map(([k, d]) => [`#/${k}`, d.title]), ['#/databases', 'Databases'],
      ['#/usage', 'Usage'], ['#/quotas', 'Quotas'], ['#/host', 'Host']];
    nav.replaceChildren(...links.map(([href, t]) => h('a', { href }, t)));
  }
  document.getElementById('signout').hidden = !me;
  document.getElementById('who').textContent = !me ? '' : me.role === 'platform' ? `platform admin · ${me.name || me.key_id}`
    : `${me.org} · ${me.name || me.key_id} (${me.role})`;
}

function signInPage() {
  const input = h('input', { id: 'key', type: 'password', autocomplete: 'off', required: true, placeholder: 'moat_…' });
  const form = h('form', { class: 'signin', id: 'signin' },
    h('h1', {}, 'Sign in to moat'),
    h('label', { for: 'key' }, 'API key'),
    input,
    h('button', { type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    showError(null);
    try {
      await api('POST', '/ui/session', { key: input.value });
      input.value = '';
      await route();
    } catch (e) {
      showError(e);
    }
  });
  main().replaceChildren(form);
  input.focus();
}

async function route() {
  if (state.page && state.page.stop) state.page.stop();
  state.page = null;
  showError(null);
  let me;
  try {
    const r = await api('GET', '/v1/me');
    me = { org: r.org.id, role: r.key.role, name: r.key.name, key_id: r.key.id };
  } catch (e) {
    setSignedIn(null);
    if (e.status !== 401) showError(e);
    signInPage();
    return;
  }
  setSignedIn(me);
  const hash = location.hash || (me.role === 'platform' ? '#/orgs' : '#/sandboxes');
  const m = hash.match(/^#\/sandboxes\/([^/?]+)$/);
  const list = hash.match(/^#\/([a-z]+)$/);
  if (me.role === 'platform') state.page = hash === '#/host' ? hostPage(main(), me) : orgsPage(main(), me);
  else if (m) state.page = sandboxPage(main(), me, decodeURIComponent(m[1]));
  else if (hash === '#/usage') state.page = usagePage(main(), me);
  else if (hash === '#/databases') state.page = databasesPage(main(), me);
  else if (hash === '#/quotas') state.page = quotasPage(main(), me);
  else if (hash === '#/host') state.page = hostPage(main(), me);
  else if (list && PAGES[list[1]]) state.page = listPage(main(), me, list[1]);
  else state.page = sandboxesPage(main(), me);
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.getAttribute('href') === hash) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

document.getElementById('signout').addEventListener('click', async () => {
  try {
    await api('DELETE', '/ui/session');
  } catch (e) {
    showError(e);
  }
  location.hash = '#/sandboxes';
  await route();
});

window.addEventListener('hashchange', route);
route();
