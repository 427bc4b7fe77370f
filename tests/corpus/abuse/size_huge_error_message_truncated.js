// expect: {"ok": false, "error": {"kind": "script_error", "message": {"$contains": "[truncated: 2097152 UTF-16 code units in all]"}}}
throw new Error('x'.repeat(2 << 20))
