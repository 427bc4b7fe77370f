// expect: {"ok": false, "error": {"kind": "memory_limit"}}
// limits: {"memory_bytes": 16777216}
const m = new Map(); for (let i = 0;; i++) m.set(i, {i})
