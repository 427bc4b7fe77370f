// expect: {"ok": true, "value": "function"}
Object.setPrototypeOf(globalThis, null);
return typeof tools.examples.echo
