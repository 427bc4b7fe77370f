// expect: {"ok": true, "value": {"user": {"id": "u-1", "email": "ada@example.com", "displayName": "Ada"}, "errors": ["TypeError", "TypeError", "TypeError"]}}
// user: {"id": "u-1", "email": "ada@example.com", "displayName": "Ada"}
const errors = [];
for (const attack of [() => { user.id = "root"; }, () => { user.grants = ["admin"]; }, () => { user = { id: "root" }; }]) {
  try { attack(); } catch (e) { errors.push(e.name); }
}
return { user, errors };
