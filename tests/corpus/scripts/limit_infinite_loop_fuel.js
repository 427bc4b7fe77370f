// expect: {"ok": false, "error": {"kind": "fuel_exhausted", "limit": "fuel", "calls_started": 0}, "stats": {"fuel": 5000000}}
// limits: {"fuel": 5000000}
while (true) {}
