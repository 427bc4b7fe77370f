// expect: {"ok": false, "error": {"kind": "result_too_large"}}
// limits: {"max_result_bytes": 0}
return 1
