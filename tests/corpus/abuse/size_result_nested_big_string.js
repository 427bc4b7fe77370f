// expect: {"ok": false, "error": {"kind": "result_too_large"}}
return {a: [{b: 'x'.repeat(2 << 20)}]}
