// expect: {"ok": true, "value": {}}
return await tools.examples.echo();
