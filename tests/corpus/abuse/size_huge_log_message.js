// expect: {"ok": false, "error": {"kind": "logs_too_large"}}
console.log('x'.repeat(300 << 10))
