// expect: {"ok": false, "error": {"kind": "script_error", "stack": {"$contains": "UTF-16 code units in all]"}}}
const e = new Error('m'); Object.defineProperty(e, 'stack', {value: 'at '.repeat(1 << 19)}); throw e
