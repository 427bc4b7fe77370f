// expect: {"ok": false, "error": {"kind": "stack_overflow"}}
function down(n) { return down(n + 1) + 1; }
try { return down(0); } catch (e) { return "survived"; }
