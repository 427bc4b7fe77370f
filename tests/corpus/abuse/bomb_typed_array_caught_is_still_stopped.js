// expect: {"ok": false, "error": {"kind": "memory_limit"}}
try { return new Uint8Array(256 << 20).length } catch (e) { return 'caught' }
