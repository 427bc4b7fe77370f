// expect: {"ok": false, "error": {"kind": "deadline_exceeded", "limit": "deadline"}}
// limits: {"timeout_ms": 100, "fuel": 100000000000}
while (true) {}
