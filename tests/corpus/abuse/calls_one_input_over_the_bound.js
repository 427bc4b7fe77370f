// expect: {"ok": false, "error": {"kind": "call_memory_limit", "calls_started": 1}}
// limits: {"max_call_bytes": 1000}
await tools.examples.echo({s: 'y'.repeat(2000)});
