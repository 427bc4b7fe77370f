// expect: {"ok": true, "value": "async:TypeError"}
const r = Proxy.revocable({}, {}); r.revoke();
let pending;
try { pending = tools.examples.echo(r.proxy) } catch (e) { return 'sync:' + e.name }
try { await pending } catch (e) { return 'async:' + e.name }
