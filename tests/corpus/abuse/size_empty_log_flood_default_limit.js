// expect: {"ok": false, "error": {"kind": "logs_too_large"}}
for (;;) console.log()
