// expect: {"ok": false, "error": {"kind": "logs_too_large"}, "logs": []}
// limits: {"max_log_bytes": 0}
console.log()
