// expect: {"ok": true, "value": "TypeError"}
try { return String(tools.examples.echo.arguments) } catch (e) { return e.name }
