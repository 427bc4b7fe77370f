// expect: {"ok": true, "value": "})(); (function(){"}
return '})(); (function(){'
