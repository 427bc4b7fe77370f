// expect: {"ok": false, "error": {"kind": "capability_error", "name": "CapabilityError", "line": 3, "stack": {"$contains": "script.js:3:"}}}
const ok = await tools.examples.echo({});
await tools.examples.fail({ message: "nope" });
