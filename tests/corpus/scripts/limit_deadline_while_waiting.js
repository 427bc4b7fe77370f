// expect: {"ok": false, "error": {"kind": "deadline_exceeded", "calls_started": 1}}
// limits: {"timeout_ms": 100}
await tools.examples.sleep({ ms: 5000 });
