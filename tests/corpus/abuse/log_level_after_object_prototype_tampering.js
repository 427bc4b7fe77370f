// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "level must be"}}}
Object.prototype.verbose = 9; log('verbose', 'x')
