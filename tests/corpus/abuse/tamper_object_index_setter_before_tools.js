// expect: {"ok": true, "value": "function"}
Object.defineProperty(Object.prototype, '0', {set() { throw new Error('index') }});
return typeof tools['examples.echo']
