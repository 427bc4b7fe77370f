// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
Object.defineProperty(Error, 'prepareStackTrace', {value: (e, s) => s}); return 1
