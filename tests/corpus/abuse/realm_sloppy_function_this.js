// expect: {"ok": true, "value": true}
return Function('return this')() === globalThis
