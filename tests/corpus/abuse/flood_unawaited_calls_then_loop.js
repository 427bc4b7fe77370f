// expect: {"ok": false, "error": {"kind": "fuel_exhausted", "calls_started": 3}}
// limits: {"fuel": 50000000}
tools.examples.echo({}); tools.examples.echo({}); tools.examples.echo({});
for (;;) {}
