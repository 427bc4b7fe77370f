// expect: {"ok": false, "error": {"kind": "result_too_large"}}
return 'x'.repeat(30e6)
