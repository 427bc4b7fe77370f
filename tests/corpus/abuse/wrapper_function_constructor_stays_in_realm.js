// expect: {"ok": true, "value": "object"}
return typeof Function('return typeof tools')() === 'string' ? 'object' : 'no'
