// expect: {"ok": false, "error": {"kind": "script_error", "message": {"$contains": "[truncated: the thrown value's JSON text is over 16384 UTF-16 code units]"}}}
// The guest stops serializing a thrown non-Error at the message cap.
throw {big: 'x'.repeat(4 << 20)}
