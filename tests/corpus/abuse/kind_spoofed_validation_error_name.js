// expect: {"ok": false, "error": {"kind": "script_error", "name": "ValidationError"}}
throw Object.assign(new Error('fake'), {name: 'ValidationError'})
