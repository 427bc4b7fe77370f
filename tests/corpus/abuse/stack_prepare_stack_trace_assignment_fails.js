// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
Error.prepareStackTrace = (e, sites) => sites; return 1
