// expect: {"ok": false, "error": {"kind": "memory_limit"}}
// limits: {"memory_bytes": 33554432}
// The cap traps outside the realm: catching cannot keep the script alive.
const hoard = [];
try {
  while (true) hoard.push(new Array(100000).fill(hoard.length));
} catch (e) {
  return "survived";
}
