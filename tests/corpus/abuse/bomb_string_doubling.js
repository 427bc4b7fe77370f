// expect: {"ok": false, "error": {"kind": "script_error", "name": "InternalError", "message": "string too long"}}
let s = 'x'; for (;;) s += s
