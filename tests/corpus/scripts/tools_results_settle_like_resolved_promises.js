// expect: {"ok": true, "value": ["thenable 1", 1, "boom", "t", ["then called"], ["a", "b"], {"first": true}]}
// A call's promise is settled by the guest without resolving functions (a QuickJS patch); it
// settles as a promise resolved with the call's value would: an inherited `then` is read once
// and followed, a throwing one rejects, a string is never a thenable, reactions run in order.
// The same script under V8, with each call a promise resolved a moment later, gives the same.
const log = [];
let reads = 0;
Object.defineProperty(Object.prototype, 'then', {
  configurable: true,
  get() { reads++; return function (resolve) { log.push('then called'); resolve('thenable ' + this.n); }; },
});
const followed = await tools.examples.echo({n: 1});
const readsAfterOne = reads;
Object.defineProperty(Object.prototype, 'then', {
  configurable: true,
  get() { throw new Error('boom'); },
});
let caught = null;
try { await tools.examples.echo({n: 2}); } catch (e) { caught = e.message; }
delete Object.prototype.then;
String.prototype.then = function () { log.push('string then'); };
const text = await tools.examples.text({text: 't'});
delete String.prototype.then;
const order = [];
const a = tools.examples.echo({k: 'a'}).then(() => order.push('a'));
const b = tools.examples.echo({k: 'b'}).then(() => order.push('b'));
await Promise.all([a, b]);
const raced = await Promise.race([tools.examples.echo({first: true}), new Promise(() => {})]);
return [followed, readsAfterOne, caught, text, log, order, raced];
