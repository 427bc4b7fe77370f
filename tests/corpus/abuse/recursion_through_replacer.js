// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
function r(k, v) { return JSON.stringify({}, r) }
return JSON.stringify({a: 1}, r)
