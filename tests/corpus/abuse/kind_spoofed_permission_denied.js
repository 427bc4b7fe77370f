// expect: {"ok": false, "error": {"kind": "script_error", "name": "PermissionDenied"}}
const e = new Error('no'); e.name = 'PermissionDenied'; throw e
