// expect: {"ok": true, "value": "TypeError"}
Promise.reject = () => 'nope';
try { await tools.examples.echo(1, 2) } catch (e) { return e.name }
