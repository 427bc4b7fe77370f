// expect: {"ok": true, "value": [{}, 1, {}, {}, {}]}
// An empty object argument is sent as `{}` without `JSON.stringify` only when that is what
// `JSON.stringify` would make: a `toJSON` on Object.prototype (here a getter) is still read, once.
let reads = 0;
Object.defineProperty(Object.prototype, "toJSON", {
  get() { reads++; return undefined; },
  configurable: true,
});
const getter = await tools.examples.echo({});
delete Object.prototype.toJSON;
const emptied = {x: 1};
delete emptied.x;
const deleted = await tools.examples.echo(emptied);
const bare = await tools.examples.echo(Object.create(null));
const symbolKeyed = await tools.examples.echo({[Symbol("s")]: 1});
return [getter, reads, deleted, bare, symbolKeyed];
