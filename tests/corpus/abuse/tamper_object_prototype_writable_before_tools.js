// expect: {"ok": true, "value": true}
Object.prototype.writable = true; Object.prototype.configurable = true;
return Object.isFrozen(tools.examples)
