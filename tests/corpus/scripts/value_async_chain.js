// expect: {"ok": true, "value": 10}
const double = async (x) => x * 2;
const values = await Promise.all([1, 2].map(double));
return values.reduce((a, b) => a + b, 0) + (await double(2)) + (await Promise.resolve(0));
