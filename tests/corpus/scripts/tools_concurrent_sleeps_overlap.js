// expect: {"ok": true, "value": true}
// Four 150 ms sleeps in parallel must all finish before a fifth, sequential one would.
const results = await Promise.all([1, 2, 3, 4].map(() => tools.examples.sleep({ ms: 150 })));
return results.every((r) => r.slept_ms === 150);
