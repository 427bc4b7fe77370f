// expect: {"ok": true, "logs": [{"message": ""}]}
// limits: {"max_log_bytes": 64}
console.log()
