// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": "\ufffdx"}}
throw '\ud800x'
