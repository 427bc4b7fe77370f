// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
const o = {toString() { return String(o) }};
return String(o)
