// expect: {"ok": false, "error": {"kind": "script_error", "name": "RangeError"}}
return 'x'.repeat(2 ** 31).length
