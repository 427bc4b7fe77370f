// expect: {"ok": true, "value": "undefined"}
return typeof Error.prepareStackTrace
