// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 50000000}
function f() { queueMicrotask(f) }
f();
return 1
