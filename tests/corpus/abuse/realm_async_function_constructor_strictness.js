// expect: {"ok": true, "value": "undefined"}
const AsyncFunction = (async () => {}).constructor;
return await new AsyncFunction('"use strict"; return typeof this')()
