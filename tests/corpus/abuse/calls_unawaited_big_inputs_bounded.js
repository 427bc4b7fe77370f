// expect: {"ok": false, "error": {"kind": "call_memory_limit", "limit": "call_memory"}}
// limits: {"max_call_bytes": 1048576}
const big = 'x'.repeat(100 << 10);
for (let i = 0; i < 100; i++) tools.examples.echo({s: big});
return 1
