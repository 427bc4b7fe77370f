// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 1000}
return 1
