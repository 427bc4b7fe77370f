// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
let v = 1; for (let i = 0; i < 101; i++) v = {v}; return v
