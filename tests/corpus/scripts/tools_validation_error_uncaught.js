// expect: {"ok": false, "error": {"kind": "invalid_input", "name": "ValidationError", "line": 2, "message": {"$contains": "Additional properties"}}}
await tools.examples.sleep({ ms: 1, extra: true });
