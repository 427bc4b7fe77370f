// expect: {"ok": true, "value": 2}
return 2 // })(); (function(){
