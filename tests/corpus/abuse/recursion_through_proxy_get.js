// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
const p = new Proxy({}, {get(t, k) { return p[k] }});
return p.x
