// expect: {"ok": true, "value": "undefined"}
return typeof (function () { return this })()
