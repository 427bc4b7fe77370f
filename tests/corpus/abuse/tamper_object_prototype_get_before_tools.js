// expect: {"ok": true, "value": "function"}
Object.prototype.get = function () { return 1 };
return typeof tools.examples.echo
