// expect: {"ok": false, "error": {"kind": "script_error"}}
const fs = await import("fs");
return typeof fs;
