// expect: {"ok": false, "error": {"kind": "logs_too_large"}, "logs": [{}]}
// limits: {"max_log_bytes": 64}
console.log(); console.log()
