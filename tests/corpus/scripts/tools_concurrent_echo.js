// expect: {"ok": true, "value": [{"n": 1}, {"n": 2}, {"n": 3}], "stats": {"calls": 3}}
return await Promise.all([1, 2, 3].map((n) => tools.examples.echo({ n })));
