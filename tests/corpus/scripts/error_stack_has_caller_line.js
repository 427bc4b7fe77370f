// expect: {"ok": false, "error": {"stack": {"$contains": "at outer (script.js:7:"}}}
function inner(value) {
  return value.missing.field;
}

function outer() {
  return inner({});
}
return outer();
