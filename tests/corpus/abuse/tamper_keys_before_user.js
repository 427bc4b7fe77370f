// expect: {"ok": true, "value": true}
// user: {"id": "u2"}
Object.keys = () => [];
return Object.isFrozen(user) && user.id === 'u2'
