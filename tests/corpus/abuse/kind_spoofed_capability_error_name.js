// expect: {"ok": false, "error": {"kind": "script_error", "name": "CapabilityError", "tool_call_id": {"$absent": true}}}
throw Object.assign(new Error('fake'), {name: 'CapabilityError'})
