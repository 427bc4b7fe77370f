// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
const o = {toString() { try { return String(o) } catch (e) { return 'caught' } }};
return String(o)
