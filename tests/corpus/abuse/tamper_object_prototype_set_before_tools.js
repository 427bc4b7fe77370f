// expect: {"ok": true, "value": "function"}
Object.prototype.set = function () {};
return typeof tools.examples.echo
