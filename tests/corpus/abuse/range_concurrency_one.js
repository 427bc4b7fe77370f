// expect: {"ok": true, "value": [1, 2]}
// limits: {"max_concurrent_calls": 1}
const r = await Promise.all([tools.examples.echo({n: 1}), tools.examples.echo({n: 2})]); return r.map(x => x.n)
