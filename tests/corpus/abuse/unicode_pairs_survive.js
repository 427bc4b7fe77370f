// expect: {"ok": true, "value": ["\ud83d\ude00"]}
return ['\ud83d\ude00']
