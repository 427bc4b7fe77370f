// expect: {"ok": true, "value": "a\ufffd"}
return "a" + "\ud800";
