// expect: {"ok": true, "value": {"$absent": true}}
// limits: {"max_result_bytes": 0}
return undefined
