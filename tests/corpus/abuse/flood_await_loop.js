// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 50000000}
for (;;) await null
