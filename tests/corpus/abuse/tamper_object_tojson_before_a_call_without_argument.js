// expect: {"ok": true, "value": [{}, {}, {"tampered": true}]}
// A call without an argument (or with `undefined`) passes `{}` as is: the guest never makes an
// object for it, so a `toJSON` a script put on Object.prototype does not reach it. An object the
// script passes is its own, and is serialized as JSON.stringify would.
Object.prototype.toJSON = function () { return {tampered: true}; };
const none = await tools.examples.echo();
const undef = await tools.examples.echo(undefined);
const own = await tools.examples.echo({});
delete Object.prototype.toJSON;
return [none, undef, own];
