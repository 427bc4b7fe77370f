// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": "{\"message\":\"a\ufffdb\"}"}}
// A thrown object that only looks like an Error is reported as its JSON text, with U+FFFD for
// the lone surrogate, not the `\ud800` escape JSON.stringify writes.
throw {message: 'a\ud800b'}
