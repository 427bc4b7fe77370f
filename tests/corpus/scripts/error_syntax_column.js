// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError", "line": 2, "column": 8}}
return );
