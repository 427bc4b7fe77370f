// expect: {"ok": false, "error": {"name": "RangeError", "message": "too far", "line": 4}}
await tools.examples.echo({});
await tools.examples.sleep({ ms: 1 });
throw new RangeError("too far");
