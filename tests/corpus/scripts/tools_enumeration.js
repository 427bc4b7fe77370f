// expect: {"ok": true, "value": ["examples", "examples.echo", "examples.fail", "examples.sleep", "examples.text"]}
return Object.keys(tools).sort();
