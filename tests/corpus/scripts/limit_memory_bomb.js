// expect: {"ok": false, "error": {"kind": "memory_limit", "limit": "memory"}}
// limits: {"memory_bytes": 33554432}
const hoard = [];
while (true) hoard.push("x".repeat(1 << 16) + hoard.length);
