// expect: {"ok": false, "session_error": {"$contains": "timeout_ms must be between 1"}}
// limits: {"timeout_ms": 86400001}
return 1
