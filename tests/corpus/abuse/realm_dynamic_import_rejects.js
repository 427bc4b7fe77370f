// expect: {"ok": false, "error": {"kind": "script_error"}}
await import('os')
