// expect: {"ok": true, "value": ["ValidationError", true], "stats": {"calls": 1}}
try {
  await tools.examples.sleep({ ms: "soon" });
} catch (e) {
  return [e.name, e.message.includes("/ms")];
}
