// expect: {"ok": true, "value": {"s": "\ufffd!"}}
return await tools.examples.echo({s: '\ud800!'})
