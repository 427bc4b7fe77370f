// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "nests more than 100"}}}
const o = {toJSON() { return [o] }};
return o
