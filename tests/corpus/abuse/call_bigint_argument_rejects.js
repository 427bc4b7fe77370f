// expect: {"ok": true, "value": "async:TypeError"}
let pending;
try { pending = tools.examples.echo({n: 1n}) } catch (e) { return 'sync:' + e.name }
try { await pending } catch (e) { return 'async:' + e.name }
