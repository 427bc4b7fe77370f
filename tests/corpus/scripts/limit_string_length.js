// expect: {"ok": false, "error": {"kind": "script_error", "name": "InternalError", "message": {"$contains": "too long"}}}
// limits: {"memory_bytes": 33554432}
// QuickJS caps string length (2^30); ropes reach it before the memory cap.
let s = "x";
while (true) s = s + s;
