// expect: {"ok": true, "logs": [{"message": "\ufffd", "fields": {"k": "\ufffd"}}]}
log('warn', '\ud800', {k: '\udfff'})
