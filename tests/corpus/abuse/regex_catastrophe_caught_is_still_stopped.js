// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 100000000}
try { return /(x+x+)+y/.test('x'.repeat(40)) } catch (e) { return 'caught' }
