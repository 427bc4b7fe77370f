// expect: {"ok": true}
return JSON.parse('['.repeat(100) + ']'.repeat(100))
