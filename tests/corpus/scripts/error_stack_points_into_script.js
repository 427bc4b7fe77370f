// expect: {"ok": false, "error": {"kind": "script_error", "name": "TypeError", "line": 4, "stack": {"$contains": "script.js:4:"}}}
function inner(value) {
  // line 4 calls something that is not a function
  return value.missing();
}
function outer() {
  return inner({});
}
return outer();
