// expect: {"ok": true, "logs": [{"message": "{\"k\":\"a\ufffdb\",\"pair\":\"\ud83d\ude00\",\"text\":\"\\\\ud800\"} [\"\ufffd\"]"}]}
// An object logged with a lone surrogate shows U+FFFD, as a string logged on its own does, not
// the `\ud800` escape JSON.stringify writes; a pair and a backslash followed by `ud800` are kept.
console.log({k: 'a\ud800b', pair: '\ud83d\ude00', text: '\\ud800'}, ['\udfff'])
