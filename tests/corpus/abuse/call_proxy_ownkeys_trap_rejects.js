// expect: {"ok": true, "value": "async:keys"}
const p = new Proxy({}, {ownKeys() { throw new Error('keys') }});
let pending;
try { pending = tools.examples.echo(p) } catch (e) { return 'sync:' + e.message }
try { await pending } catch (e) { return 'async:' + e.message }
