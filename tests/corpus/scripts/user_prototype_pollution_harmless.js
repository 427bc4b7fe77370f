// expect: {"ok": true, "value": ["u-2", false]}
// user: {"id": "u-2"}
Object.prototype.id = "root";
Object.prototype.isAdmin = true;
return [user.id, Object.prototype.hasOwnProperty.call(user, "isAdmin")];
