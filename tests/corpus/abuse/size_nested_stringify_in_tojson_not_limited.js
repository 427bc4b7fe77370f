// expect: {"ok": true, "value": 3}
// limits: {"max_result_bytes": 16}
const big = 'q'.repeat(1 << 20);
return {toJSON() { return JSON.stringify(big).length > 0 ? 3 : 0 }}
