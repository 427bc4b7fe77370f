// expect: {"ok": false, "error": {"kind": "memory_limit"}}
// limits: {"memory_bytes": 33554432}
const a = []; a.length = 1 << 26; return a.join('abcdefgh').length
