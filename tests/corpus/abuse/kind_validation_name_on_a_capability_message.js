// expect: {"ok": false, "error": {"kind": "script_error"}}
try { await tools.examples.fail({message: 'on purpose'}) } catch (e) { e.name = 'ValidationError'; throw e }
