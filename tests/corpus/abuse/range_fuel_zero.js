// expect: {"ok": false, "session_error": {"$contains": "fuel must be at least 1"}}
// limits: {"fuel": 0}
return 1
