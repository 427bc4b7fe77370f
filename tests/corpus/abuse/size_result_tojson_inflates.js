// expect: {"ok": false, "error": {"kind": "result_too_large"}}
return {toJSON() { return 'z'.repeat(3 << 20) }}
