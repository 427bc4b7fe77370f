// expect: {"ok": false, "error": {"kind": "too_many_calls", "limit": "total_calls", "calls_started": 5}}
// limits: {"max_total_calls": 5}
for (let i = 0; i < 10; i++) await tools.examples.echo({ i });
