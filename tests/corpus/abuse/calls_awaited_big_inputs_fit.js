// expect: {"ok": true, "value": 20}
// limits: {"max_call_bytes": 1048576}
const big = 'x'.repeat(100 << 10);
let n = 0;
for (let i = 0; i < 20; i++) n += (await tools.examples.echo({s: big})).s.length > 0 ? 1 : 0;
return n
