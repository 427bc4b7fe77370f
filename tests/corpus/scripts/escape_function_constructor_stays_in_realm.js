// expect: {"ok": true, "value": [true, "undefined"]}
const g = Function("return this")();
return [g === globalThis, typeof g.process];
