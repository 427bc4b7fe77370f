// expect: {"ok": false, "error": {"kind": "script_error", "message": "m", "stack": {"$contains": "f�"}}}
const o = {["f\ud800"]() { throw new Error("m") }};
o["f\ud800"]()
