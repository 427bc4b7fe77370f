// expect: {"ok": false, "error": {"kind": "capability_error", "name": "CapabilityError", "tool_call_id": "corpus:0:0"}}
try { await tools.examples.fail({message: 'on purpose'}) } catch (e) { throw e }
