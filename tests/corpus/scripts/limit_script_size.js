// expect: {"ok": false, "error": {"kind": "invalid_input"}}
// limits: {"max_script_bytes": 200}
// This script is longer than two hundred bytes because of this comment, which goes on
// and on so that the limit is exceeded before anything runs at all.
return 1;
