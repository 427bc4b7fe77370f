// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "level must be"}}}
log('toString', 'x')
