// expect: {"ok": false, "session_error": {"$contains": "timeout_ms must be between 1"}}
// limits: {"timeout_ms": 18446744073709551615}
return 1
