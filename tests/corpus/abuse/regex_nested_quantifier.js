// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 100000000}
return /(a+)+$/.test('a'.repeat(40) + 'b')
