// expect: {"ok": true, "value": "async:getter"}
const arg = {get x() { throw new Error('getter') }};
let pending;
try { pending = tools.examples.echo(arg) } catch (e) { return 'sync:' + e.message }
try { await pending } catch (e) { return 'async:' + e.message }
