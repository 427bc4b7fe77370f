// expect: {"ok": true, "value": {"id": "u1", "email": null, "displayName": null}}
// user: {"id": "u1"}
Object.defineProperty(Object.prototype, 'id', {set() { throw new Error('id') }});
Object.defineProperty(Object.prototype, 'email', {set() {}});
return user
