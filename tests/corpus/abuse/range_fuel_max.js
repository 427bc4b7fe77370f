// expect: {"ok": true, "value": 2}
// limits: {"fuel": 18446744073709551615}
return 2
