// expect: {"ok": false, "error": {"kind": "result_too_large"}}
return Array.from({length: 400000}, (_, i) => i)
