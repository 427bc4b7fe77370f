// expect: {"ok": true, "value": [null, "object"]}
return [user, typeof user];
