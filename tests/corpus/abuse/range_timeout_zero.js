// expect: {"ok": false, "session_error": {"$contains": "timeout_ms must be between 1"}}
// limits: {"timeout_ms": 0}
return 1
