// expect: {"ok": false, "error": {"kind": "capability_error", "name": "CapabilityError"}}
globalThis.Error = function () { return {name: 'Fake'} };
await tools.examples.fail({message: 'on purpose'})
