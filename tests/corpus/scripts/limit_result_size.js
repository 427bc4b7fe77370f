// expect: {"ok": false, "error": {"kind": "result_too_large", "limit": "result_size"}}
// limits: {"max_result_bytes": 1000}
return "x".repeat(2000);
