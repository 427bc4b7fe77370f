// expect: {"ok": false, "error": {"kind": "deadline_exceeded"}}
// limits: {"timeout_ms": 1, "fuel": 1000000000000}
for (;;) {}
