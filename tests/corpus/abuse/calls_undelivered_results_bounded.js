// expect: {"ok": false, "error": {"kind": "call_memory_limit"}}
// limits: {"max_call_bytes": 100000}
const calls = [];
for (let i = 0; i < 20; i++) calls.push(tools.examples.echo({s: 'z'.repeat(10000)}));
return (await Promise.all(calls)).length
