// expect: {"ok": true, "value": ["z", "a", "m"]}
const o = { z: 1, a: 2, m: 3 };
return Object.keys(o);
