// expect: {"ok": true, "value": [1, "examples.echo", false, "TypeError", {"n": 1}, {"n": 4}, {"0": 5}, {"m": 3}, ["getPrototypeOf"], "TypeError", {"n": 6}]}
// A tool's function is native: one declared parameter, its capability's name, no `prototype`,
// not a constructor. It starts a call at once for an object literal's kind of object (frozen or
// without a prototype too); any other argument goes through the prelude's check, with the
// outcome that check has always given: an `arguments` object, or a proxy of a plain object
// (its trap runs once), is a fine argument; a class instance is refused.
const echo = tools.examples.echo;
let constructed;
try { new echo({}); constructed = 'constructed'; } catch (e) { constructed = e.name; }
const bare = Object.create(null);
bare.n = 1;
const traps = [];
const proxied = new Proxy({m: 3}, {getPrototypeOf() { traps.push('getPrototypeOf'); return Object.prototype; }});
class Point { constructor() { this.x = 1; } }
let refused;
try { await echo(new Point()); } catch (e) { refused = e.name; }
return [
  echo.length,
  echo.name,
  'prototype' in echo,
  constructed,
  await echo(bare),
  await echo(Object.freeze({n: 4})),
  await (function () { return echo(arguments); })(5),
  await echo(proxied),
  traps,
  refused,
  await echo.call({not: 'this'}, {n: 6}),
];
