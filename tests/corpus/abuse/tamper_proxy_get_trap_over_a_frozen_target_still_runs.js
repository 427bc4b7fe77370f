// expect: {"ok": true, "value": [[1, 1, 1, 2], 5, true, "TypeError"]}
// The namespaces of `tools` skip their own `get` trap for the names they already hold (a QuickJS
// patch, for proxies the prelude marks). A script's proxy is never marked: over a frozen target,
// whose values its trap must return, the trap still runs on every read, and an inconsistent
// answer is still refused.
let calls = 0;
const target = Object.freeze({a: 1, b: 2});
const p = new Proxy(target, { get(t, k) { calls++; return t[k]; } });
const read = [p.a, p.a, p.a, p.b];
const viaTools = new Proxy(tools, { get(t, k) { calls++; return t[k]; } });
const echo = viaTools.examples;
const liar = new Proxy(target, { get() { return 3; } });
let refused = null;
try { void liar.a; } catch (e) { refused = e.name; }
return [read, calls, echo === tools.examples, refused];
