// expect: {"ok": false, "error": {"kind": "script_error", "name": "E\ufffd"}}
throw Object.assign(new Error('m'), {name: 'E\udbff'})
