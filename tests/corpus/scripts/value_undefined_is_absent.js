// expect: {"ok": true, "value": {"$absent": true}}
const x = 1;
// no return: the value is undefined
