// expect: {"ok": true, "logs": [{"level": "info", "message": "plain 1 {\"a\":[1,2]} true"}, {"level": "info", "message": "info"}, {"level": "debug", "message": "debug"}, {"level": "warn", "message": "warn"}, {"level": "error", "message": {"$contains": "TypeError: bad"}}]}
console.log("plain", 1, { a: [1, 2] }, true);
console.info("info");
console.debug("debug");
console.warn("warn");
console.error(new TypeError("bad"));
