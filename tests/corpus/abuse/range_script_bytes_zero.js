// expect: {"ok": false, "error": {"kind": "invalid_input"}}
// limits: {"max_script_bytes": 0}
return 1
