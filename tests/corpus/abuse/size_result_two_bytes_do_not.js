// expect: {"ok": false, "error": {"kind": "result_too_large"}}
// limits: {"max_result_bytes": 1}
return 10
