// expect: {"ok": true, "value": ["TypeError", "examples.echo takes one object argument, got 2"], "stats": {"calls": 0}}
try {
  await tools.examples.echo({}, 2);
} catch (e) {
  return [e.name, e.message];
}
