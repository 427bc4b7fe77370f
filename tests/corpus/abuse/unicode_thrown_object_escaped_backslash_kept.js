// expect: {"ok": false, "error": {"kind": "script_error", "message": "{\"k\":\"\\\\ud800 \\\\\ufffd\"}"}}
// A backslash followed by `ud800` is text, not an escape: only real lone surrogates change.
throw {k: '\\ud800 \\\ud800'}
