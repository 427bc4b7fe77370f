// expect: {"ok": true, "stats": {"calls": 0}}
console.log("one");
log("info", "two");
