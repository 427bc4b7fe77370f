// expect: {"ok": false, "error": {"kind": "script_error"}}
class CapabilityError extends Error { constructor(m) { super(m); this.name = 'CapabilityError' } }
throw new CapabilityError('examples.fail failed: on purpose')
