// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
delete globalThis.console; return 1
