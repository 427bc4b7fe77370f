// expect: {"ok": false, "error": {"kind": "fuel_exhausted", "calls_started": 2}}
// limits: {"fuel": 20000000}
await tools.examples.echo({});
await tools.examples.echo({});
for (;;) {}
