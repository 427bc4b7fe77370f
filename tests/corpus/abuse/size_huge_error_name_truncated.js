// expect: {"ok": false, "error": {"kind": "script_error", "name": {"$contains": "[truncated: 1048576 UTF-16 code units in all]"}}}
throw Object.assign(new Error('m'), {name: 'N'.repeat(1 << 20)})
