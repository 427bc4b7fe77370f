// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": "{\"k\":\"\\ud800\"}"}}
throw {k: '\ud800'}
