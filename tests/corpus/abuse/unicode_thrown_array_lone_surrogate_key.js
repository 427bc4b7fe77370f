// expect: {"ok": false, "error": {"kind": "script_error", "message": "[{\"\ufffdk\":\"\ud800\udc00\ufffd\"}]"}}
// Keys too; a real pair stays the character it encodes.
throw [{['\udc00k']: '\ud800\udc00\udbff'}]
