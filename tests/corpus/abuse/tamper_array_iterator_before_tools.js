// expect: {"ok": true, "value": {"x": 1}}
Array.prototype[Symbol.iterator] = function* () { throw new Error('iter') };
return await tools.examples.echo({x: 1})
