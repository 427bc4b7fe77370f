// expect: {"ok": true, "value": [true, true]}
// Math.random is seeded by the host (seed 0 unless entropy is granted): values repeat per session.
const a = Math.random(), b = Math.random();
return [a >= 0 && a < 1, a !== b];
