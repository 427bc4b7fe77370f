// expect: {"ok": true, "value": [true, true, "TypeError", "TypeError", "function"]}
const errors = [];
for (const attack of [() => { tools.examples.echo = () => "hijacked"; }, () => { tools.extra = 1; }]) {
  try { attack(); } catch (e) { errors.push(e.name); }
}
return [Object.isFrozen(tools), Object.isFrozen(tools.examples), ...errors, typeof tools.examples.echo];
