// expect: {"ok": true, "logs": [{"message": "a\ufffdb \ufffd"}]}
console.log('a\ud800b', '\udfff')
