// expect: {"ok": true, "value": []}
return Reflect.ownKeys(globalThis).filter(k => /native|Native|javy|Javy/.test(String(k))).map(String)
