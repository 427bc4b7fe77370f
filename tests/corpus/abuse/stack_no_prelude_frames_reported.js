// expect: {"ok": false, "error": {"kind": "capability_error", "stack": {"$contains": "script.js"}}}
await tools.examples.fail({message: 'on purpose'})
