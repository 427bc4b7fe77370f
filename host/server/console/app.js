// The console's pages: sign-in, sessions, a session (timeline, live, and acting on it), agents,
// actions, and the server panel. Routes live in the URL's fragment (#/...), so the server
// serves one page and every path the console shows is its own.

import { ApiError, call, command, follow, forgetToken, keepToken, query, sessionPath, token } from './api.js';
import { badge, bytes, code, el, facts, json, link, micros, number, table } from './render.js';

const main = document.getElementById('main');
const toastBox = document.getElementById('toast');
const ATTENTION = ['uncertain', 'paused', 'waiting'];
const STATUSES = ['uncertain', 'paused', 'waiting', 'running', 'runnable', 'idle', 'completed', 'failed', 'cancelled'];
const SESSIONS_PER_PAGE = 50;
const ENTRIES_PER_PAGE = 100;

/** Whatever the current page started (a live stream) and must stop when it is left. */
let leaving = [];

/** Counts navigations: a page still loading when the next one starts renders nothing. */
let navigation = 0;

/** Whether the navigation `mine` has been left since (its page must not render). */
function left(mine) {
  return mine !== navigation;
}

function toast(text) {
  toastBox.textContent = text;
}

function role() {
  return sessionStorage.getItem('corral.console.role') ?? 'tenant';
}

function errorPanel(error) {
  const text =
    error instanceof ApiError
      ? `${error.status} ${error.code}: ${error.message}`
      : `error: ${error?.message ?? error}`;
  return el('p', { class: 'error', role: 'alert' }, text);
}

/** Shows `nodes` as the page, with `title` as its heading and the document's title. */
function page(title, ...nodes) {
  document.title = `${title} · corral console`;
  main.replaceChildren(el('h1', {}, title), ...nodes.flat().filter(Boolean));
}

/** A button that runs `action` once at a time (disabled while it runs). */
function actionButton(label, action, props = {}) {
  const button = el('button', { type: 'button', ...props }, label);
  button.addEventListener('click', async () => {
    if (button.disabled) return;
    button.disabled = true;
    try {
      await action();
    } catch (error) {
      toast(error instanceof ApiError ? `${error.status} ${error.code}: ${error.message}` : String(error));
      button.after(errorPanel(error));
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

// ---------------------------------------------------------------------------------------------
// Sign-in

function signInPage(problem) {
  const input = el('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false' });
  const form = el(
    'form',
    { class: 'card signin', 'aria-labelledby': 'signin-heading' },
    el('h2', { id: 'signin-heading' }, 'Sign in with a token'),
    el('p', {}, 'An operator token sees every tenant; a tenant token sees its own tenant only. The token is kept for this tab only and sent as the Authorization header.'),
    el('label', { for: 'token' }, 'Token'),
    input,
    el('button', { type: 'submit' }, 'Sign in'),
    problem ? errorPanel(problem) : null,
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    keepToken(input.value.trim());
    try {
      await call('GET', '/v1/sessions');
    } catch (error) {
      forgetToken();
      signInPage(error.status === 403 ? new Error('executor tokens cannot use the console') : error);
      return;
    }
    try {
      await call('GET', '/metrics');
      sessionStorage.setItem('corral.console.role', 'operator');
    } catch {
      sessionStorage.setItem('corral.console.role', 'tenant');
    }
    // One navigation: setting the same hash again fires no hashchange.
    if (location.hash === '#/sessions') route();
    else location.hash = '#/sessions';
  });
  page('corral console', form);
  input.focus();
}

// ---------------------------------------------------------------------------------------------
// Sessions

async function sessionsPage(params) {
  const filters = {
    tenant: params.get('tenant') ?? '',
    agent: params.get('agent') ?? '',
    status: params.get('status') ?? '',
    owner: params.get('owner') ?? '',
  };
  // Paging is the API's: `after` is the cursor of the page shown, `from` how many came before it.
  const after = params.get('after') ?? '';
  const from = Math.max(0, Number(params.get('from') ?? 0) || 0);
  page('Sessions', el('p', {}, 'Loading…'));
  const mine = navigation;
  let list;
  let agents = [];
  try {
    [list, agents] = await Promise.all([
      call(
        'GET',
        `/v1/sessions${query({
          tenantId: filters.tenant,
          agentId: filters.agent,
          status: filters.status,
          ownerUserId: filters.owner,
          limit: SESSIONS_PER_PAGE,
          after,
        })}`,
      ),
      call('GET', '/v1/agents').then((a) => a.agents),
    ]);
  } catch (error) {
    if (!left(mine)) page('Sessions', filterForm(filters, agents), errorPanel(error));
    return;
  }
  if (left(mine)) return;
  // The counts are the server's, over every session that matches the filters other than status.
  const counts = new Map(Object.entries(list.counts ?? {}));
  const matching = filters.status
    ? filters.status.split(',').reduce((sum, s) => sum + (counts.get(s) ?? 0), 0)
    : [...counts.values()].reduce((sum, n) => sum + n, 0);
  const rows = list.sessions.map((s) => [
    s.tenantId,
    link(sessionRoute(s.tenantId, s.id), s.id),
    s.agentId,
    s.ownerUserId,
    badge(s.status),
    s.activeTurnId ?? '—',
  ]);
  const countChips = el(
    'ul',
    { class: 'counts', 'aria-label': 'Sessions by status' },
    STATUSES.filter((s) => counts.has(s)).map((s) =>
      el('li', { class: ATTENTION.includes(s) ? 'attention' : '' }, link(sessionsRoute({ ...filters, status: s }), badge(s), ` ${counts.get(s)}`)),
    ),
  );
  const shown = list.sessions.length;
  const caption = `${matching} sessions` + (shown < matching ? `, ${from + 1} to ${from + shown} shown` : '');
  page(
    'Sessions',
    filterForm(filters, agents),
    countChips,
    shown ? table(caption, ['tenant', 'session', 'agent', 'owner', 'status', 'active turn'], rows) : el('p', {}, 'No sessions match.'),
    pager(after !== '', list.next, (cursor) => sessionsRoute({ ...filters, after: cursor, from: cursor ? from + shown : '' })),
    newSessionForm(agents),
  );
}

function sessionsRoute(filters) {
  return `#/sessions${query(filters)}`;
}

function sessionRoute(tenant, id) {
  return `#/session/${encodeURIComponent(tenant)}/${encodeURIComponent(id)}`;
}

/** Links to the first page (when not on it) and to the next (when there is one). */
function pager(notFirst, next, routeOf) {
  if (!notFirst && !next) return null;
  return el(
    'nav',
    { class: 'pager', 'aria-label': 'Pages' },
    notFirst ? link(routeOf(''), '← First page') : null,
    next ? link(routeOf(next), 'Next →') : null,
  );
}

function field(id, label, input) {
  return el('div', { class: 'field' }, el('label', { for: id }, label), input);
}

function filterForm(filters, agents) {
  const tenant = el('input', { id: 'f-tenant', value: filters.tenant, placeholder: 'every tenant' });
  const agent = el('select', { id: 'f-agent' }, el('option', { value: '' }, 'every agent'), agents.map((a) => el('option', { value: a.agentId }, a.agentId)));
  agent.value = filters.agent;
  const status = el('select', { id: 'f-status' }, el('option', { value: '' }, 'every status'), STATUSES.map((s) => el('option', { value: s }, s)));
  status.value = filters.status;
  const owner = el('input', { id: 'f-owner', value: filters.owner, placeholder: 'every owner' });
  const form = el(
    'form',
    { class: 'filters', 'aria-label': 'Filter sessions' },
    role() === 'operator' ? field('f-tenant', 'Tenant', tenant) : null,
    field('f-agent', 'Agent', agent),
    field('f-status', 'Status', status),
    field('f-owner', 'Owner', owner),
    el('button', { type: 'submit' }, 'Filter'),
  );
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    location.hash = sessionsRoute({ tenant: tenant.value.trim(), agent: agent.value, status: status.value, owner: owner.value.trim() });
  });
  return form;
}

function newSessionForm(agents) {
  const agent = el('select', { id: 'n-agent', required: true }, agents.map((a) => el('option', { value: a.agentId }, a.agentId)));
  const tenant = el('input', { id: 'n-tenant', placeholder: 'default' });
  const id = el('input', { id: 'n-id', required: true, value: `s-${Date.now().toString(36)}` });
  const owner = el('input', { id: 'n-owner', required: true, value: 'operator' });
  const message = el('textarea', { id: 'n-message', rows: 2 }, 'Run two sleeps at once');
  const form = el(
    'form',
    { class: 'card', 'aria-labelledby': 'new-heading' },
    el('h2', { id: 'new-heading' }, 'Start a session'),
    field('n-agent', 'Agent', agent),
    role() === 'operator' ? field('n-tenant', 'Tenant', tenant) : null,
    field('n-id', 'Session id', id),
    field('n-owner', 'Owner user id', owner),
    field('n-message', 'First message', message),
    el('button', { type: 'submit' }, 'Create and send'),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const submit = form.querySelector('button[type=submit]');
    submit.disabled = true;
    try {
      const tenantId = tenant.value.trim() || undefined;
      const view = await call('PUT', sessionPath(tenantId, id.value), { agentId: agent.value, ownerUserId: owner.value });
      if (message.value.trim()) await command(view.tenantId, view.id, { type: 'message', content: message.value });
      location.hash = sessionRoute(view.tenantId, view.id);
    } catch (error) {
      form.append(errorPanel(error));
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

// ---------------------------------------------------------------------------------------------
// A session's timeline: events folded into entries (a script with its result, an approval with
// its decision, a model step's text), grouped by turn, shown a page of entries at a time so a
// history of tens of thousands of events stays light.

class Timeline {
  constructor() {
    this.entries = [];
    this.byKey = new Map();
    this.events = 0;
    this.lastCursor = 0;
  }

  entry(key, make) {
    let entry = key ? this.byKey.get(key) : undefined;
    if (!entry) {
      entry = make();
      this.entries.push(entry);
      if (key) this.byKey.set(key, entry);
    }
    return entry;
  }

  add(event) {
    this.events += 1;
    this.lastCursor = event.cursor;
    const turn = event.turnId ?? '';
    const data = event.data ?? {};
    const base = () => ({ turn, cursor: event.cursor, time: event.time });
    switch (event.type) {
      case 'text.delta': {
        const entry = this.entry(`text:${turn}:${data.step}`, () => ({ ...base(), kind: 'text', step: data.step, text: '' }));
        entry.text += data.text ?? '';
        break;
      }
      case 'tool.started':
      case 'tool.finished': {
        const entry = this.entry(`tool:${turn}:${data.toolCallId}`, () => ({ ...base(), kind: 'tool', name: data.name, step: data.step }));
        if (event.type === 'tool.started') entry.arguments = data.arguments;
        else entry.finished = data;
        break;
      }
      case 'permission.requested':
      case 'permission.resolved':
      case 'command.approve':
      case 'command.respond': {
        const id = data.interaction?.interactionId ?? data.interactionId;
        const entry = this.entry(`interaction:${id}`, () => ({ ...base(), kind: 'interaction', id }));
        if (event.type === 'permission.requested') entry.interaction = data.interaction;
        else if (event.type === 'permission.resolved') entry.resolved = data;
        else entry.decision = { ...data, type: event.type, time: event.time };
        break;
      }
      case 'run.suspended':
      case 'run.waiting':
        break; // repeated by turn.paused / turn.waiting
      default:
        this.entries.push({ ...base(), kind: 'event', type: event.type, data });
    }
  }
}

function entryView(entry) {
  switch (entry.kind) {
    case 'text':
      return el('article', { class: 'entry entry-text' }, el('h4', {}, `model · step ${entry.step ?? '?'}`), el('p', { class: 'text' }, entry.text));
    case 'tool':
      return toolView(entry);
    case 'interaction':
      return interactionView(entry);
    default:
      return eventView(entry);
  }
}

/** A script's log line: `[level] message` (its message as the script wrote it). */
function logLine(line) {
  if (line && typeof line === 'object' && typeof line.message === 'string') return `[${line.level ?? 'log'}] ${line.message}`;
  return typeof line === 'string' ? line : JSON.stringify(line);
}

function toolView(entry) {
  const finished = entry.finished;
  const result = finished?.result;
  const stats = result?.stats ?? {};
  const parts = [el('h4', {}, `${entry.name} · step ${entry.step ?? '?'}`, finished ? (finished.isError ? ' · error' : ' · done') : ' · not finished')];
  if (entry.arguments && typeof entry.arguments.code === 'string') parts.push(code(entry.arguments.code));
  else if (entry.arguments !== undefined) parts.push(el('h5', {}, 'input'), json(entry.arguments));
  if (result && typeof result === 'object' && 'ok' in result) {
    if (result.ok) parts.push(el('h5', {}, 'value'), json(result.value));
    else parts.push(el('h5', { class: 'error' }, 'error'), json(result.error));
    if (Array.isArray(result.logs) && result.logs.length) {
      parts.push(el('h5', {}, 'logs'), el('ol', { class: 'logs' }, result.logs.map((line) => el('li', {}, logLine(line)))));
    }
  } else if (finished) {
    parts.push(el('h5', {}, 'output'), json(result));
  }
  if (finished) {
    parts.push(
      el(
        'p',
        { class: 'stats' },
        `fuel ${number(finished.fuel ?? stats.fuel)} · wall ${micros(finished.wallUs ?? stats.wall_us)} · peak memory ${bytes(stats.peak_memory_bytes)} · ${number(finished.calls ?? stats.calls)} calls`,
      ),
    );
  }
  return el('article', { class: `entry entry-tool${finished?.isError ? ' failed' : ''}` }, parts);
}

function decisionText(entry) {
  const d = entry.decision;
  if (d) {
    const verdict = d.type === 'command.respond' ? 'answered' : d.approved ? 'approved' : 'rejected';
    return `${verdict} by ${d.decidedBy ?? 'unknown'} at ${d.time}${d.reason ? ` · reason: ${d.reason}` : ''}`;
  }
  if (entry.resolved?.auto) return 'approved automatically (autoConfirm)';
  if (entry.resolved) return entry.resolved.approved ? 'approved' : 'rejected';
  return 'waiting for a person';
}

function interactionView(entry) {
  const interaction = entry.interaction ?? {};
  return el(
    'article',
    { class: 'entry entry-interaction' },
    el('h4', {}, `${interaction.kind ?? 'interaction'} · ${interaction.toolName ?? ''}`),
    el('p', { class: 'decision' }, decisionText(entry)),
    interaction.argumentsSha256 ? el('p', { class: 'hash' }, `argumentsSha256 ${interaction.argumentsSha256}`) : null,
  );
}

function eventView(entry) {
  const turnEnd = entry.type.startsWith('turn.');
  let summary = null;
  if (entry.type === 'command.message') summary = el('p', { class: 'text' }, entry.data.content ?? '');
  else if (entry.type === 'turn.completed') summary = el('p', { class: 'text' }, entry.data.output?.text ?? '');
  return el(
    'article',
    { class: `entry entry-event${turnEnd ? ' turn-end' : ''} type-${entry.type.replace(/[^a-z]/g, '-')}` },
    el('h4', {}, entry.type === 'command.message' ? 'user message' : entry.type),
    summary,
    el('details', {}, el('summary', {}, `event data (cursor ${entry.cursor}, ${entry.time})`), json(entry.data)),
  );
}

/** Renders one page of the timeline's entries, a heading at each turn. */
function timelinePage(timeline, pageNumber) {
  const start = (pageNumber - 1) * ENTRIES_PER_PAGE;
  const slice = timeline.entries.slice(start, start + ENTRIES_PER_PAGE);
  const out = [];
  let turn = null;
  let group = null;
  for (const entry of slice) {
    if (entry.turn !== turn || !group) {
      turn = entry.turn;
      group = el('section', { class: 'turn', 'aria-label': `turn ${turn || '(none)'}` }, el('h3', {}, turn ? `turn ${turn}` : 'session'));
      out.push(group);
    }
    group.append(entryView(entry));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// A session

async function sessionPage(tenant, id) {
  page(`Session ${id}`, el('p', {}, 'Loading…'));
  const mine = navigation;
  let view;
  try {
    view = await call('GET', sessionPath(tenant, id));
  } catch (error) {
    if (!left(mine)) page(`Session ${id}`, errorPanel(error), el('p', {}, link('#/sessions', 'Back to sessions')));
    return;
  }
  if (left(mine)) return;
  const timeline = new Timeline();
  const header = el('div', { id: 'session-facts' });
  const acting = el('section', { id: 'acting', 'aria-label': 'Acting on the session' });
  const liveState = el('p', { id: 'live-state', class: 'live', role: 'status' }, 'connecting…');
  const pages = el('div', { id: 'timeline-pages' });
  const entriesBox = el('div', { id: 'timeline', class: 'timeline' });
  const follow_ = el('input', { id: 'follow', type: 'checkbox', checked: true });
  let shownPage = 1;
  let scheduled = false;

  function pagesCount() {
    return Math.max(1, Math.ceil(timeline.entries.length / ENTRIES_PER_PAGE));
  }

  function renderTimeline() {
    scheduled = false;
    const count = pagesCount();
    if (follow_.checked) shownPage = count;
    shownPage = Math.min(shownPage, count);
    const go = (n) => {
      shownPage = n;
      follow_.checked = n === pagesCount();
      renderTimeline();
    };
    pages.replaceChildren(
      el(
        'nav',
        { class: 'pager', 'aria-label': 'Timeline pages' },
        el('button', { type: 'button', disabled: shownPage <= 1, onclick: () => go(1) }, '« First'),
        el('button', { type: 'button', disabled: shownPage <= 1, onclick: () => go(shownPage - 1) }, '‹ Earlier'),
        el('span', {}, `page ${shownPage} of ${count} · ${number(timeline.events)} events · cursor ${timeline.lastCursor}`),
        el('button', { type: 'button', disabled: shownPage >= count, onclick: () => go(shownPage + 1) }, 'Later ›'),
        el('button', { type: 'button', disabled: shownPage >= count, onclick: () => go(count) }, 'Latest »'),
      ),
    );
    entriesBox.replaceChildren(...timelinePage(timeline, shownPage));
  }

  function scheduleRender() {
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(renderTimeline);
    }
  }

  let refreshing = null;
  async function refreshView() {
    try {
      const fresh = await call('GET', sessionPath(tenant, id));
      // Unchanged: keep the cards as they are (and what the person is typing in them).
      if (JSON.stringify(fresh) === JSON.stringify(view)) return;
      view = fresh;
      renderHeader();
    } catch (error) {
      acting.replaceChildren(errorPanel(error));
    }
  }

  function renderHeader() {
    header.replaceChildren(
      facts([
        ['status', badge(view.status)],
        ['tenant', view.tenantId],
        ['agent', view.agentId],
        ['owner', view.ownerUserId],
        ['manifest', view.manifestHash],
        ['version', view.implementationVersion],
        ['active turn', view.activeTurnId ?? '—'],
        ['last error', view.error ? `${view.error.code}: ${view.error.message}` : '—'],
      ]),
    );
    acting.replaceChildren(...actingViews(view, tenant, id, refreshView));
  }

  renderHeader();
  page(
    `Session ${id}`,
    header,
    acting,
    el('h2', {}, 'Timeline'),
    liveState,
    el('div', { class: 'field inline' }, follow_, el('label', { for: 'follow' }, 'Follow the latest events')),
    pages,
    entriesBox,
  );
  follow_.addEventListener('change', scheduleRender);

  const stream = follow(
    view.tenantId,
    view.id,
    0,
    (batch) => {
      let decisive = false;
      for (const event of batch) {
        timeline.add(event);
        if (!event.type.startsWith('text.') && !event.type.startsWith('tool.')) decisive = true;
      }
      scheduleRender();
      if (decisive && !refreshing) {
        refreshing = setTimeout(() => {
          refreshing = null;
          refreshView();
        }, 100);
      }
    },
    (state, error) => {
      liveState.textContent = state === 'live' ? 'live' : state === 'reconnecting' ? 'reconnecting (resumes after the last event shown)…' : `stream failed: ${error?.message ?? ''}`;
      liveState.dataset.state = state;
    },
  );
  leaving.push(() => stream.stop());
  scheduleRender();
}

/** What a person can do now: decide pending interactions, settle uncertain effects, cancel, send. */
function actingViews(view, tenant, id, refresh) {
  const out = [];
  const send = async (body, done) => {
    const answer = await command(view.tenantId, view.id, body);
    toast(`${body.type} accepted (cursor ${answer.cursor})`);
    if (done) done();
    await refresh();
  };
  if (Array.isArray(view.waits)) {
    for (const interaction of view.waits) out.push(pendingView(interaction, send));
  }
  for (const effect of view.uncertainEffects ?? []) out.push(uncertainView(effect, send));
  if (view.actions?.length) {
    out.push(
      table(
        'Open actions',
        ['action', 'capability', 'status', 'generation', 'claim', 'lease expires'],
        view.actions.map((a) => [a.actionId, a.capabilityId, a.status, String(a.generation), a.claimId ?? '—', a.leaseExpiresAt ?? '—']),
      ),
    );
  }
  if (view.activeTurnId) out.push(cancelView(send));
  if (['idle', 'completed', 'failed', 'cancelled'].includes(view.status)) out.push(messageView(send));
  return out;
}

function pendingView(interaction, send) {
  const key = interaction.interactionId.replace(/[^A-Za-z0-9]/g, '-');
  const reason = el('textarea', { id: `reason-${key}`, rows: 2 });
  const args = interaction.arguments ?? {};
  const body = [
    el('h2', { id: `pending-${key}` }, interaction.kind === 'input' ? 'Input requested' : 'Approval needed', `: ${interaction.toolName}`, interaction.capabilityId ? ` (${interaction.capabilityId})` : ''),
    typeof args.code === 'string' ? code(args.code) : json(args),
    el('p', { class: 'hash' }, 'argumentsSha256 ', el('code', {}, interaction.argumentsSha256)),
  ];
  if (interaction.kind === 'input') {
    const value = el('textarea', { id: `value-${key}`, rows: 3 }, 'null');
    body.push(
      field(`value-${key}`, 'Answer (JSON)', value),
      actionButton('Respond', () => send({ type: 'respond', interactionId: interaction.interactionId, value: JSON.parse(value.value) })),
    );
  } else {
    body.push(
      field(`reason-${key}`, 'Reason (optional; the model sees it on a rejection)', reason),
      el(
        'div',
        { class: 'buttons' },
        actionButton('Approve', () => send({ type: 'approve', interactionId: interaction.interactionId, approved: true, reason: reason.value || undefined }), { class: 'approve' }),
        actionButton('Reject', () => send({ type: 'approve', interactionId: interaction.interactionId, approved: false, reason: reason.value || undefined }), { class: 'reject' }),
      ),
    );
  }
  return el('section', { class: 'card pending', 'aria-labelledby': `pending-${key}` }, body);
}

function uncertainView(effect, send) {
  const key = effect.effectId.replace(/[^A-Za-z0-9]/g, '-');
  const confirmBox = el('div', { class: 'confirm' });
  const outcomeKind = el('select', { id: `kind-${key}` }, el('option', { value: 'value' }, 'it succeeded, with this value (JSON)'), el('option', { value: 'error' }, 'it failed, with this message'));
  const outcome = el('textarea', { id: `outcome-${key}`, rows: 2 }, 'null');
  const ask = (what, explanation, body) => {
    confirmBox.replaceChildren(
      el('p', { class: 'warning' }, explanation),
      el(
        'div',
        { class: 'buttons' },
        actionButton(`Confirm: ${what}`, () => send(body(), () => confirmBox.replaceChildren()), { class: 'danger' }),
        el('button', { type: 'button', onclick: () => confirmBox.replaceChildren() }, 'Back'),
      ),
    );
    confirmBox.querySelector('button')?.focus();
  };
  return el(
    'section',
    { class: 'card uncertain', 'aria-labelledby': `uncertain-${key}` },
    el('h2', { id: `uncertain-${key}` }, `Uncertain effect: ${effect.kind}`),
    el('p', {}, 'The server stopped while this effect was in flight: it may or may not have happened. Check the outside system, then settle it.'),
    facts([
      ['effect', effect.effectId],
      ['turn', effect.turnId],
      ['why', effect.error ?? '—'],
    ]),
    el(
      'div',
      { class: 'buttons' },
      el(
        'button',
        {
          type: 'button',
          onclick: () =>
            ask('retry', 'Retry runs the effect again. If it did happen before the crash, it happens twice. Confirm only if it is safe to repeat or you checked that it did not happen.', () => ({ type: 'resolve', effectId: effect.effectId, retry: true })),
        },
        'Retry…',
      ),
    ),
    field(`kind-${key}`, 'Or supply its outcome', outcomeKind),
    field(`outcome-${key}`, 'Outcome', outcome),
    el(
      'button',
      {
        type: 'button',
        onclick: () =>
          ask('record this outcome', 'The outcome is recorded as the effect\u2019s result without running it; the turn continues with it. Confirm only if you know what happened.', () => ({
            type: 'resolve',
            effectId: effect.effectId,
            outcome: outcomeKind.value === 'value' ? { value: JSON.parse(outcome.value) } : { error: outcome.value },
          })),
      },
      'Supply outcome…',
    ),
    confirmBox,
  );
}

function cancelView(send) {
  const reason = el('input', { id: 'cancel-reason' });
  const confirmBox = el('div', { class: 'confirm' });
  return el(
    'section',
    { class: 'card', 'aria-labelledby': 'cancel-heading' },
    el('h2', { id: 'cancel-heading' }, 'Cancel the turn'),
    field('cancel-reason', 'Reason (optional)', reason),
    el(
      'button',
      {
        type: 'button',
        onclick: () => {
          confirmBox.replaceChildren(
            el('p', { class: 'warning' }, 'Cancelling ends the turn: pending approvals and actions are dropped.'),
            actionButton('Confirm: cancel the turn', () => send({ type: 'cancel', reason: reason.value || undefined }), { class: 'danger' }),
          );
          confirmBox.querySelector('button')?.focus();
        },
      },
      'Cancel turn…',
    ),
    confirmBox,
  );
}

function messageView(send) {
  const content = el('textarea', { id: 'message', rows: 2 });
  return el(
    'section',
    { class: 'card', 'aria-labelledby': 'message-heading' },
    el('h2', { id: 'message-heading' }, 'Send a message'),
    field('message', 'Message', content),
    actionButton('Send', () => send({ type: 'message', content: content.value }, () => (content.value = ''))),
  );
}

// ---------------------------------------------------------------------------------------------
// Agents, actions, server

async function agentsPage() {
  page('Agents', el('p', {}, 'Loading…'));
  const mine = navigation;
  try {
    const { agents } = await call('GET', '/v1/agents');
    if (left(mine)) return;
    page(
      'Agents',
      agents.length ? null : el('p', {}, 'No agents registered.'),
      agents.map((a) =>
        el(
          'section',
          { class: 'card' },
          el('h2', {}, a.agentId),
          facts([
            ['manifest hash', a.manifestHash],
            ['implementation version', a.implementationVersion],
          ]),
          el('details', {}, el('summary', {}, 'manifest'), json(a.manifest)),
          link(sessionsRoute({ agent: a.agentId }), `Sessions of ${a.agentId}`),
        ),
      ),
    );
  } catch (error) {
    if (!left(mine)) page('Agents', errorPanel(error));
  }
}

async function actionsPage() {
  page('Actions', el('p', {}, 'Loading…'));
  const mine = navigation;
  try {
    // GET /v1/actions is for executor tokens; an operator sees open actions in session views.
    // Open sessions are the ones that can have open actions; the first 100 of them are shown.
    const { sessions: open } = await call('GET', `/v1/sessions${query({ status: 'waiting,uncertain,running,runnable,paused', limit: 100 })}`);
    const views = await Promise.all(open.map((s) => call('GET', sessionPath(s.tenantId, s.id))));
    if (left(mine)) return;
    const rows = views.flatMap((v) =>
      v.actions.map((a) => [link(sessionRoute(v.tenantId, v.id), `${v.tenantId}/${v.id}`), a.actionId, a.capabilityId, badge(a.status), String(a.generation), a.claimId ?? '—', a.leaseExpiresAt ?? '—']),
    );
    page(
      'Actions',
      el('p', {}, 'Actions not completed or cancelled, from the open sessions (pending: no executor has claimed it; claimed: leased until its expiry; the generation fences stale claims).'),
      rows.length ? table(`${rows.length} open actions`, ['session', 'action', 'capability', 'status', 'generation', 'claim', 'lease expires'], rows) : el('p', {}, 'No open actions.'),
    );
  } catch (error) {
    if (!left(mine)) page('Actions', errorPanel(error));
  }
}

const METRICS = [
  'corral_commands_total',
  'corral_command_rejections_total',
  'corral_turns_total',
  'corral_effects_total',
  'corral_uncertain_total',
  'corral_lease_expiries_total',
  'corral_sse_streams',
  'corral_sse_dropped_total',
  'corral_store_latency_seconds_count',
  'corral_store_latency_seconds_sum',
];

async function serverPage() {
  page('Server', el('p', {}, 'Loading…'));
  const mine = navigation;
  let ready;
  try {
    ready = await fetch('/ready', { cache: 'no-store', credentials: 'omit' }).then((r) => r.json());
  } catch (error) {
    ready = { status: 'unreachable', checks: {}, error };
  }
  let metrics;
  try {
    const text = await call('GET', '/metrics');
    metrics = String(text)
      .split('\n')
      .filter((line) => line && !line.startsWith('#'))
      .map((line) => line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/))
      .filter((m) => m && METRICS.includes(m[1]))
      .map((m) => [m[1], m[2] ?? '', m[3]]);
  } catch (error) {
    metrics = error;
  }
  if (left(mine)) return;
  page(
    'Server',
    el('h2', {}, 'Readiness'),
    facts([['status', badge(ready.status)], ...Object.entries(ready.checks ?? {}).map(([k, v]) => [k, v ? 'ok' : 'failing'])]),
    el('h2', {}, 'Metrics'),
    Array.isArray(metrics)
      ? table('Main figures from /metrics', ['metric', 'labels', 'value'], metrics)
      : el('p', {}, metrics.status === 403 ? '/metrics needs an operator token.' : `/metrics: ${metrics.message}`),
  );
}

// ---------------------------------------------------------------------------------------------
// Routing

function route() {
  navigation += 1;
  for (const stop of leaving) stop();
  leaving = [];
  const signedIn = Boolean(token());
  document.getElementById('nav').hidden = !signedIn;
  document.getElementById('sign-out').hidden = !signedIn;
  document.getElementById('who').textContent = signedIn ? (role() === 'operator' ? 'operator token' : 'tenant token') : '';
  if (!signedIn) {
    signInPage();
    return;
  }
  const hash = location.hash.startsWith('#/') ? location.hash.slice(2) : 'sessions';
  const [path, search = ''] = hash.split('?');
  const parts = path.split('/').map((p) => decodeURIComponent(p));
  const params = new URLSearchParams(search);
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.getAttribute('href') === `#/${parts[0]}`) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.focus({ preventScroll: true });
  switch (parts[0]) {
    case 'session':
      if (parts.length === 3) return sessionPage(parts[1], parts[2]);
      break;
    case 'sessions':
      return sessionsPage(params);
    case 'agents':
      return agentsPage();
    case 'actions':
      return actionsPage();
    case 'server':
      return serverPage();
  }
  page('Not found', el('p', {}, 'No such page. '), link('#/sessions', 'Sessions'));
}

window.addEventListener('hashchange', () => {
  if (location.hash === '' || location.hash.startsWith('#/')) route();
});
document.getElementById('sign-out').addEventListener('click', () => {
  forgetToken();
  if (location.hash === '#/sessions') route();
  else location.hash = '#/sessions';
});
route();
