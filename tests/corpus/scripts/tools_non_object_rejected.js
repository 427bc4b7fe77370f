// expect: {"ok": true, "value": ["TypeError", "TypeError", "TypeError"], "stats": {"calls": 0}}
const names = [];
for (const bad of ["text", [1, 2], null]) {
  try { await tools.examples.echo(bad); } catch (e) { names.push(e.name); }
}
return names;
