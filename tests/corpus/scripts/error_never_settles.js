// expect: {"ok": false, "error": {"kind": "script_error", "message": {"$contains": "never settle"}}}
await new Promise(() => {});
return 1;
