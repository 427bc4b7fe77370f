// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 100000000}
return /^(\w+\s?)*$/.test('word '.repeat(20) + '!')
