// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
const o = {get x() { return this.x }};
return o.x
