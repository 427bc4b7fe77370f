// expect: {"ok": false, "error": {"kind": "memory_limit"}}
// limits: {"memory_bytes": 16777216}
const ps = []; for (;;) ps.push(new Promise(() => {}))
