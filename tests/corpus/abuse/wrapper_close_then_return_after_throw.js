// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError"}}
throw new Error('boom') })(); (function(){ return 'escaped' })(); (async () => {
