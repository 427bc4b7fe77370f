// expect: {"ok": true, "value": {"x": 2}}
JSON.stringify = () => '{"x":99}'; JSON.parse = () => ({x: 99});
return (await tools.examples.echo({x: 2}))
