// expect: {"ok": true, "value": {"y": 1}}
Function.prototype.call = () => { throw new Error('call') };
Function.prototype.apply = () => { throw new Error('apply') };
return await tools.examples.echo({y: 1})
