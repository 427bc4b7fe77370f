// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
Object.defineProperty(globalThis, 'log', {value: () => {}}); return 1
