// expect: {"ok": true, "value": 3, "stats": {"calls": 0}}
return 1 + 2;
