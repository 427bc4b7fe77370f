// expect: {"ok": true, "value": 2000}
function depth(n) { return n === 0 ? 0 : 1 + depth(n - 1); }
return depth(2000);
