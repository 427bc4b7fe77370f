// expect: {"ok": true, "value": [true, "function", "examples.echo"]}
return [tools["examples.echo"] === tools.examples.echo, typeof tools["examples.sleep"], tools.examples.echo.name];
