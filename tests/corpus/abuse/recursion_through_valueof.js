// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
const o = {valueOf() { return o + 1 }};
return o + 1
