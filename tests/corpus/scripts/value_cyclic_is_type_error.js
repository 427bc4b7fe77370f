// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
const a = {};
a.self = a;
return a;
