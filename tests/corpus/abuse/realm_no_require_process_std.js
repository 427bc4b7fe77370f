// expect: {"ok": true, "value": ["undefined", "undefined", "undefined", "undefined", "undefined", "undefined"]}
return [typeof require, typeof process, typeof std, typeof os, typeof fetch, typeof WebAssembly]
