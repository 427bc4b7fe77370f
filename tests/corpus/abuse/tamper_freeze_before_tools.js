// expect: {"ok": true, "value": true}
Object.freeze = (o) => o;
return Object.isFrozen(tools) && Object.isFrozen(tools.examples)
