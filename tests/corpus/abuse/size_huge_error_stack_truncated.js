// expect: {"ok": false, "error": {"kind": "script_error", "stack": {"$contains": "bytes in all]"}}}
const e = new Error('m'); Object.defineProperty(e, 'stack', {value: 'at '.repeat(1 << 19)}); throw e
