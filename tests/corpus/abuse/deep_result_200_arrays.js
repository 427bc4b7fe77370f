// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "nests more than 100"}}}
return JSON.parse('['.repeat(200) + ']'.repeat(200))
