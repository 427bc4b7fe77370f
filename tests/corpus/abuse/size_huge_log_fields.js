// expect: {"ok": false, "error": {"kind": "logs_too_large"}}
log('info', 'm', {blob: 'x'.repeat(300 << 10)})
