// expect: {"ok": false, "error": {"kind": "fuel_exhausted"}}
// limits: {"fuel": 1}
return 1
