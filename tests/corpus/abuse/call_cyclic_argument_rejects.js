// expect: {"ok": true, "value": "async:TypeError"}
const a = {}; a.a = a;
let pending;
try { pending = tools.examples.echo(a) } catch (e) { return 'sync:' + e.name }
try { await pending } catch (e) { return 'async:' + e.name }
