// expect: {"ok": true}
let v = 'leaf'; for (let i = 0; i < 99; i++) v = [v];
log('info', 'm', {v})
