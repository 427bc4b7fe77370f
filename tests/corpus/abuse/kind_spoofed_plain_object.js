// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error"}}
throw {name: 'CapabilityError', message: 'x'}
