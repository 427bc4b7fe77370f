// expect: {"ok": true, "value": 98}
let v = 0; for (let i = 0; i < 98; i++) v = [v];
let r = (await tools.examples.echo({v})).v, d = 0;
while (Array.isArray(r)) { r = r[0]; d++ }
return d
