// expect: {"ok": true}
// limits: {"max_result_bytes": 1000}
return "x".repeat(990);
