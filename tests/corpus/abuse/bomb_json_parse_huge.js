// expect: {"ok": false, "error": {"kind": "memory_limit"}}
// limits: {"memory_bytes": 33554432}
const t = '[' + '1,'.repeat(8 << 20) + '1]'; return JSON.parse(t).length
