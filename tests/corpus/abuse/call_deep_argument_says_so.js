// expect: {"ok": true, "value": {"$contains": "nests more than 99"}}
let v = 0; for (let i = 0; i < 200; i++) v = [v];
try { await tools.examples.echo({v}) } catch (e) { return e.message }
