// expect: {"ok": true, "value": [null, null, null, null, null, false, "function"]}
// Names that are not bound (symbols, inherited names, lone surrogates) are absent; reading them
// binds nothing and leaves the real capabilities in place.
const t = tools;
return [
  t[Symbol.iterator] ?? null,
  t.__proto__ ?? null,
  t.toString ?? null,
  t.examples['\ud800'] ?? null,
  t['examples.echo\u0000'] ?? null,
  'constructor' in t,
  typeof t.examples.echo,
];
