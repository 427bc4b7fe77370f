// expect: {"ok": true, "value": 3}
// limits: {"max_total_calls": 0}
return 3
