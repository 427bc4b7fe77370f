// expect: {"ok": false, "error": {"kind": "too_many_calls", "calls_started": 3}}
// limits: {"max_total_calls": 3}
await Promise.all(Array.from({ length: 50 }, (_, i) => tools.examples.echo({ i })));
