// expect: {"ok": true, "logs": [{"level": "warn", "message": "quota low", "fields": {"left": 3, "unit": "calls"}, "script_id": "corpus:0"}]}
log("warn", "quota low", { left: 3, unit: "calls" });
