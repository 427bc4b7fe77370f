// DOM helpers. Everything a model, a user, a script or a tool wrote reaches the page through
// text nodes (textContent), never through an HTML parser (the server's unit tests refuse the
// DOM's HTML-parsing sinks in every console file), and no link is built from data.

// Control characters, bidirectional overrides and invisible separators would let a text pass
// for another one; they are shown as \u{...} escapes instead (newline and tab are kept).
const HIDDEN = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u200B-\u200F\u2028-\u202E\u2060-\u2069\uFEFF]/g;

/** `text` with every hidden or control character made visible as `\u{HEX}`. */
export function visible(text) {
  return String(text).replace(HIDDEN, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
}

/**
 * An element. `props`: `class`, `id`, `for`, `type`, `name`, `value`, `role`, `hidden`,
 * `disabled`, `placeholder`, `aria-*`, `data-*`, `title`, `rows`, `min`, `checked`, `open`,
 * `tabindex`, and `on*` handlers; children are nodes or strings (made text nodes, visible()).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name === 'value') node.value = value;
    else if (name === 'checked' || name === 'open' || name === 'hidden' || name === 'disabled') node[name] = Boolean(value);
    else if (name === 'href' || name.startsWith('src') || name === 'style') throw new Error(`el(): ${name} is not allowed; use link()`);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

/** Appends strings (as text) and nodes, flattening arrays and skipping null. */
export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(child)));
  }
  return node;
}

/** A link to one of the console's own pages (`#/...`): the only links the console makes. */
export function link(route, ...children) {
  const a = el('a', {}, ...children);
  if (!route.startsWith('#/')) throw new Error('link(): console routes only');
  a.setAttribute('href', route);
  return a;
}

/** A value as indented JSON text (its strings' control characters escaped by JSON itself). */
export function json(value) {
  return el('pre', { class: 'json' }, JSON.stringify(value, null, 2) ?? 'undefined');
}

const TOKENS = new RegExp(
  [
    '(\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/)', // comment
    '("(?:[^"\\\\\\n]|\\\\.)*"|\'(?:[^\'\\\\\\n]|\\\\.)*\'|`(?:[^`\\\\]|\\\\.)*`)', // string
    '\\b(\\d[\\d_]*(?:\\.\\d+)?)\\b', // number
    '\\b(const|let|var|await|async|return|function|if|else|for|while|of|in|new|try|catch|finally|throw|true|false|null|undefined|typeof|class|break|continue)\\b',
  ].join('|'),
  'g',
);
const KINDS = ['comment', 'string', 'number', 'keyword'];

/** JavaScript source, highlighted with spans whose text is set as text. */
export function code(source) {
  const text = String(source);
  const out = el('code', { class: 'js' });
  let at = 0;
  for (const match of text.matchAll(TOKENS)) {
    if (match.index > at) append(out, [text.slice(at, match.index)]);
    const kind = KINDS[match.slice(1).findIndex((group) => group !== undefined)];
    out.append(el('span', { class: `tok-${kind}` }, match[0]));
    at = match.index + match[0].length;
  }
  if (at < text.length) append(out, [text.slice(at)]);
  return el('pre', { class: 'code' }, out);
}

/** A status as a labelled badge (the word is shown; the colour only repeats it). */
export function badge(status) {
  return el('span', { class: `badge status-${String(status).replace(/[^a-z_]/g, '')}` }, String(status));
}

/** A definition list of `[term, value]` pairs (values: strings or nodes). */
export function facts(pairs) {
  return el('dl', { class: 'facts' }, pairs.filter(([, v]) => v !== undefined).map(([term, value]) => [el('dt', {}, term), el('dd', {}, value ?? '—')]));
}

/** A table with a caption, header cells and rows of cells (strings or nodes). */
export function table(caption, headers, rows) {
  return el(
    'table',
    {},
    el('caption', {}, caption),
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows.map((cells) => el('tr', {}, cells.map((c) => el('td', {}, c))))),
  );
}

/** `n` with thousands separators. */
export function number(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : '—';
}

/** Microseconds as milliseconds. */
export function micros(us) {
  return typeof us === 'number' ? `${(us / 1000).toFixed(1)} ms` : '—';
}

/** Bytes as MiB. */
export function bytes(n) {
  return typeof n === 'number' ? `${(n / 1048576).toFixed(1)} MiB` : '—';
}
