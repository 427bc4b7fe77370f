// expect: {"ok": true, "value": "}){ 3 }"}
return `}){ ${1 + 2} }`
