// expect: {"ok": true, "value": "async:tojson"}
const arg = {toJSON() { throw new Error('tojson') }};
let pending;
try { pending = tools.examples.echo(arg) } catch (e) { return 'sync:' + e.message }
try { await pending } catch (e) { return 'async:' + e.message }
