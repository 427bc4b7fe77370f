// expect: {"ok": true, "value": "async:trap"}
const p = new Proxy({}, {getPrototypeOf() { throw new Error('trap') }});
let pending;
try { pending = tools.examples.echo(p) } catch (e) { return 'sync:' + e.message }
try { await pending } catch (e) { return 'async:' + e.message }
