// expect: {"ok": false, "session_error": {"$contains": "below the"}}
// limits: {"memory_bytes": 0}
return 1
