// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 50000000}
function f() { Promise.resolve().then(f) }
f();
await new Promise(() => {})
