// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError", "message": {"$contains": "cannot end the function"}}}
})(); (function(){
