// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "nests more than 100"}}}
let v = 0; for (let i = 0; i < 10000; i++) v = [v]; return v
