// expect: {"ok": true, "value": false}
return Reflect.defineProperty(globalThis, 'tools', {value: {}})
