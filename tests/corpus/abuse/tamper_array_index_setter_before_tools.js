// expect: {"ok": true, "value": "function"}
Object.defineProperty(Array.prototype, '0', {set() { throw new Error('index') }, configurable: true});
Object.defineProperty(Array.prototype, '1', {set() { throw new Error('index') }, configurable: true});
return typeof tools.examples.echo
