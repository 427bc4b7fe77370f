// expect: {"ok": false, "error": {"kind": "script_error", "name": "ReferenceError", "line": 3}}
// scripts run in strict mode: assigning an undeclared name throws
undeclared = 1;
