// expect: {"ok": true, "value": "done"}
// Calls the script does not await are cancelled when it returns.
tools.examples.sleep({ ms: 60000 });
return "done";
