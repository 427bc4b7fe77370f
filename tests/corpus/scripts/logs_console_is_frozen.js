// expect: {"ok": true, "value": "TypeError", "logs": [{"message": "still captured"}]}
let name = "none";
try { console.log = () => {}; } catch (e) { name = e.name; }
console.log("still captured");
return name;
