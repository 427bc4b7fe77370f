// expect: {"ok": false, "error": {"kind": "script_error", "name": "CapabilityError"}}
try { await tools.examples.fail({message: 'on purpose'}) } catch (e) { e.message += '!'; throw e }
