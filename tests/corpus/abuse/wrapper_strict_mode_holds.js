// expect: {"ok": false, "error": {"kind": "script_error", "name": "ReferenceError"}}
undeclared = 1; return undeclared
