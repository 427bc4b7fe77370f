// expect: {"ok": false, "error": {"kind": "script_error", "message": {"$contains": "[truncated: 4194304 bytes in all]"}}}
throw 'y'.repeat(4 << 20)
