// expect: {"ok": false, "error": {"kind": "script_error", "message": "\ufffdx"}}
throw '\udc00x'
