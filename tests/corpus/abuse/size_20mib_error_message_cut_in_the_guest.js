// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": {"$contains": "[truncated: 20971520 UTF-16 code units in all]"}}}
// The message is cut inside the guest: only its first 16 KiB are ever turned into text.
throw new Error('x'.repeat(20 << 20))
