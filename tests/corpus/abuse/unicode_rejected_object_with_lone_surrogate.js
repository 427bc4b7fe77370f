// expect: {"ok": false, "error": {"kind": "script_error", "message": "{\"k\":\"\ufffd\"}"}}
await Promise.reject({k: '\udfff'})
