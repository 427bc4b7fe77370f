// expect: {"ok": false, "error": {"kind": "logs_too_large", "limit": "log_size"}}
// limits: {"max_log_bytes": 10000}
for (let i = 0; ; i++) console.log("line " + i + " " + "y".repeat(100));
