// expect: {"ok": false, "session_error": {"$contains": "max_concurrent_calls must be at least 1"}}
// limits: {"max_concurrent_calls": 0}
return 1
