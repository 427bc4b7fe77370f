// expect: {"ok": false, "error": {"kind": "script_error", "message": {"$contains": "[truncated: 4194304 UTF-16 code units in all]"}}}
throw 'y'.repeat(4 << 20)
