// expect: {"ok": true, "value": "string"}
const o = {}; Error.captureStackTrace(o); return typeof o.stack
