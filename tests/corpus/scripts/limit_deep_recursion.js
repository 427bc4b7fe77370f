// expect: {"ok": false, "error": {"kind": "stack_overflow", "limit": "stack"}}
function down(n) { return down(n + 1) + 1; }
return down(0);
