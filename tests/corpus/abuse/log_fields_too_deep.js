// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "nest more than 100"}}}
let v = 0; for (let i = 0; i < 150; i++) v = [v];
log('info', 'm', {v})
