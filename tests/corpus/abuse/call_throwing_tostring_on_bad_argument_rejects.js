// expect: {"ok": true, "value": {"$contains": "async:"}}
const arg = [];
arg.toString = () => { throw new Error('tostring') };
JSON.stringify = () => { throw new Error('tostring') };
let pending;
try { pending = tools.examples.echo(Object.create(arg)) } catch (e) { return 'sync:' + e.message }
try { await pending } catch (e) { return 'async:' + e.message }
