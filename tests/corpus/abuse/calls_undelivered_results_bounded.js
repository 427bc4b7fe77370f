// expect: {"ok": false, "error": {"kind": "call_memory_limit"}}
// limits: {"max_call_bytes": 100000, "max_concurrent_calls": 1}
// The calls queue behind a sleeping one (one runs at a time), so they are not answered as they
// start: their inputs, then their results, wait in the host, and what it holds for them is
// bounded.
const calls = [tools.examples.sleep({ms: 20})];
for (let i = 0; i < 20; i++) calls.push(tools.examples.echo({s: 'z'.repeat(10000)}));
return (await Promise.all(calls)).length
