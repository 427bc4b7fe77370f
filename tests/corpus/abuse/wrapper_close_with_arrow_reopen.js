// expect: {"ok": false, "error": {"kind": "script_error", "name": "SyntaxError"}}
})()
;(() => { return 5 })()//
