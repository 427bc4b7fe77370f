// expect: {"ok": true, "logs": [{"fields": {"a": 1}}]}
log('info', 'm', {toJSON() { return {a: 1} }})
