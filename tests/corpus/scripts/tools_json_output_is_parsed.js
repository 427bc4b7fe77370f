// expect: {"ok": true, "value": ["object", 5]}
const result = await tools.examples.sleep({ ms: 5 });
return [typeof result, result.slept_ms];
