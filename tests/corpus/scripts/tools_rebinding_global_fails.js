// expect: {"ok": true, "value": ["TypeError", "object"]}
let name = "none";
try { globalThis.tools = {}; } catch (e) { name = e.name; }
return [name, typeof tools];
