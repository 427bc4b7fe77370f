// expect: {"ok": false, "error": {"kind": "invalid_input", "name": "ValidationError"}}
await tools.examples.sleep({ms: 'soon'})
