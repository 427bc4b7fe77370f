// expect: {"ok": true, "value": {"$absent": true}}
--> })(); (function(){
