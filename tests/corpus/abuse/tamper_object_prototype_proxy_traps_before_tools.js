// expect: {"ok": true, "value": ["function", false, true, true, true]}
// Proxy traps a script puts on Object.prototype before reading tools must not join the handler
// tools' namespaces are built with.
for (const trap of ['get', 'has', 'set', 'ownKeys', 'getOwnPropertyDescriptor', 'defineProperty', 'deleteProperty', 'isExtensible', 'preventExtensions', 'setPrototypeOf', 'getPrototypeOf']) {
  Object.prototype[trap] = function () { throw new Error('trap ' + trap) };
}
// Descriptors crossing the traps must not pick up Object.prototype.get either.
Object.prototype.get = function () { return 'evil' };
return [typeof tools.examples.echo, 'x' in tools, Object.isFrozen(tools), Object.freeze(tools.examples) === tools.examples,
  Object.getOwnPropertyDescriptor(tools.examples, 'echo').value === tools.examples.echo];
