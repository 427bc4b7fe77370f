// expect: {"ok": true, "value": [0, "1970-01-01T00:00:00.000Z"]}
return [Date.now(), new Date().toISOString()];
