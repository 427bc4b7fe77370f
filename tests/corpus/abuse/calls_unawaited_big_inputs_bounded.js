// expect: {"ok": false, "error": {"kind": "call_memory_limit", "limit": "call_memory"}}
// limits: {"max_call_bytes": 1048576, "max_concurrent_calls": 1}
// The calls queue behind a sleeping one, so the host holds their inputs.
tools.examples.sleep({ms: 50});
const big = 'x'.repeat(100 << 10);
for (let i = 0; i < 100; i++) tools.examples.echo({s: big});
return 1
