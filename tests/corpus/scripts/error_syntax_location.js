// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError", "line": 4, "column": 11}}
const a = 1;
const b = 2;
return a +;
