// expect: {"ok": false, "error": {"kind": "script_error", "name": "Error", "message": "boom"}}
throw "boom";
