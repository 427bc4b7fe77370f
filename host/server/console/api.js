// The console's only door to the server: corral's public HTTP API, called with the bearer token
// the person signed in with. The token lives in sessionStorage (this tab only): never in a
// cookie, never in a URL.

const TOKEN_KEY = 'corral.console.token';

/** The signed-in token, or null. */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Keeps the token for this tab. */
export function keepToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

/** Forgets the token (and everything else this tab kept). */
export function forgetToken() {
  sessionStorage.clear();
}

/** An answer other than 2xx: the API's `{status, code, message}` envelope, or what came. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${token() ?? ''}`, ...extra };
}

/** `?a=1&b=2` from the parameters that are set. */
export function query(params = {}) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

/** The path of a session route (`rest` is `''`, `/commands`, `/items`, `/events`). */
export function sessionPath(tenant, id, rest = '', params = {}) {
  return `/v1/sessions/${encodeURIComponent(id)}${rest}${query({ tenantId: tenant, ...params })}`;
}

/** One request; resolves to the parsed JSON (or text), rejects with an ApiError. */
export async function call(method, path, body) {
  const init = {
    method,
    headers: authHeaders(body === undefined ? {} : { 'Content-Type': 'application/json' }),
    cache: 'no-store',
    credentials: 'omit',
    referrerPolicy: 'no-referrer',
  };
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, 'unreachable', `the server did not answer (${error.message})`);
  }
  const text = await response.text();
  let parsed = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // Prometheus text and the like stay text.
  }
  if (!response.ok) {
    const code = parsed && typeof parsed === 'object' ? parsed.code : 'http_error';
    const message = parsed && typeof parsed === 'object' ? parsed.message : text.slice(0, 300);
    throw new ApiError(response.status, code ?? 'http_error', message ?? response.statusText);
  }
  return parsed;
}

/** A fresh idempotency key: one per click, so a retried request is one command. */
export function freshKey() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
}

/** Sends one command to a session with a fresh idempotency key. */
export function command(tenant, id, body) {
  return call('POST', sessionPath(tenant, id, '/commands'), { ...body, idempotencyKey: freshKey() });
}

/**
 * Follows a session's events (SSE over fetch, since EventSource cannot send a bearer header):
 * the history after `after`, then live. On a dropped stream it reconnects from the last cursor
 * it delivered, so nothing is missed and nothing is delivered twice. `onEvents(batch)` gets
 * events in cursor order; `onState(state, detail)` gets `live`, `reconnecting` or `failed`.
 */
export function follow(tenant, id, after, onEvents, onState) {
  const controller = new AbortController();
  let last = after;
  let stopped = false;
  let delay = 250;

  async function once() {
    const response = await fetch(sessionPath(tenant, id, '/events', { cursor: last }), {
      headers: authHeaders({ Accept: 'text/event-stream' }),
      cache: 'no-store',
      credentials: 'omit',
      signal: controller.signal,
    });
    if (!response.ok) {
      let body = {};
      try {
        body = await response.json();
      } catch {
        // not JSON
      }
      throw new ApiError(response.status, body.code ?? 'http_error', body.message ?? response.statusText);
    }
    onState('live');
    delay = 250;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, '\n');
      const batch = [];
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split('\n')
          .filter((line) => line.startsWith('data:'))
          .map((line) => line.slice(5).replace(/^ /, ''))
          .join('\n');
        if (!data) continue; // a keep-alive comment
        const event = JSON.parse(data);
        if (typeof event.cursor === 'number' && event.cursor > last) {
          last = event.cursor;
          batch.push(event);
        }
      }
      if (batch.length) onEvents(batch);
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch (error) {
        if (stopped) return;
        if (error instanceof ApiError && error.status >= 400 && error.status < 500) {
          onState('failed', error);
          return;
        }
      }
      if (stopped) return;
      onState('reconnecting');
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();

  return {
    stop() {
      stopped = true;
      controller.abort();
    },
    cursor: () => last,
  };
}
