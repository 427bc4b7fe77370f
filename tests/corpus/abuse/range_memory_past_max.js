// expect: {"ok": false, "session_error": {"$contains": "above the sandbox's max_memory_bytes"}}
// limits: {"memory_bytes": 5242880000}
return 1
