// expect: {"ok": false, "error": {"kind": "script_error", "message": "{\"code\":7}"}}
throw { code: 7 };
