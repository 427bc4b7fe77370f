// expect: {"ok": true, "value": 7}
// limits: {"max_result_bytes": 1}
return 7
