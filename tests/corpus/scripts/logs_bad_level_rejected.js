// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "level"}}, "logs": []}
log("loud", "hello");
