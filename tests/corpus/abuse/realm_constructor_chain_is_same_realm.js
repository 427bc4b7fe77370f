// expect: {"ok": true, "value": true}
return (() => {}).constructor.constructor('return globalThis')() === globalThis
