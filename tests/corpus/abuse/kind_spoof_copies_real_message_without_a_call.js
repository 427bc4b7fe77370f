// expect: {"ok": false, "error": {"kind": "script_error"}}
throw Object.assign(new Error('examples.fail failed: on purpose'), {name: 'CapabilityError'})
