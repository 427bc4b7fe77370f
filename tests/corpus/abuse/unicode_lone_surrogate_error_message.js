// expect: {"ok": false, "error": {"kind": "script_error", "message": "a\ufffdb"}}
throw new Error('a\ud800b')
