// expect: {"ok": true, "value": "undefined"}
try { eval('}); globalThis.leaked = 1; (() => {') } catch (e) {}
return typeof globalThis.leaked
