// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError"}}
eval('})()'); return 1
