// expect: {"ok": true, "value": {"$absent": true}}
return undefined;
