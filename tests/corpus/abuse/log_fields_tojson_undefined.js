// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "message": {"$contains": "serialize to a JSON object"}}}
log('info', 'm', {toJSON() { return undefined }})
