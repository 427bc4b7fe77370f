// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": "{\"k\":\"\ufffd\"}"}}
throw {k: '\ud800'}
