// expect: {"ok": false, "session_error": {"$contains": "below the"}}
// limits: {"memory_bytes": 4194304}
return 1
