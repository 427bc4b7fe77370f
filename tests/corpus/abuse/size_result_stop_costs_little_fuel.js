// expect: {"ok": false, "error": {"kind": "result_too_large", "limit": "result_size"}}
// limits: {"fuel": 1600000000}
// Building the string costs about 1,560 million fuel; serializing all of it would cost hundreds
// of millions more, so only stopping at the limit ends this as result_too_large.
return 'x'.repeat(30e6)
