// expect: {"ok": true, "value": "TypeError"}
try { return String(console.log.caller) } catch (e) { return e.name }
