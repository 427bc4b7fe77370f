// expect: {"ok": false, "session_error": {"$contains": "above the sandbox's max_memory_bytes"}}
// limits: {"memory_bytes": 18446744073709551615}
return 1
