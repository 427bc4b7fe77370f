// expect: {"ok": false, "error": {"kind": "too_many_calls", "calls_started": 0}}
// limits: {"max_total_calls": 0}
await tools.examples.echo({})
