// expect: {"ok": true, "value": ["undefined", "undefined", "undefined", "undefined", "undefined", "undefined", "undefined", "undefined", "undefined", "undefined"]}
return [typeof require, typeof process, typeof fetch, typeof XMLHttpRequest, typeof WebAssembly, typeof std, typeof os, typeof Deno, typeof Javy, typeof setTimeout];
