// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError"}}
return 10n;
