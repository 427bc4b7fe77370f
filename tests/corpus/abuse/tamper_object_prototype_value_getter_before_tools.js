// expect: {"ok": true, "value": "function"}
Object.defineProperty(Object.prototype, 'value', {get() { throw new Error('value') }});
return typeof tools.examples.echo
