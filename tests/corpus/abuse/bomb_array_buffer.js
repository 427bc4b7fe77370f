// expect: {"ok": false, "error": {"kind": "memory_limit"}}
return new ArrayBuffer(512 << 20).byteLength
