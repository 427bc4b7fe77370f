// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError"}}
if (true) { return 1 } } )(); globalThis.escaped = 1; (async () => { {
