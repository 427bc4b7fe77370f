// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError"}}
return `abc ${1}
