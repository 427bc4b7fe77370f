// expect: {"ok": true, "value": ["TypeError", "TypeError", "TypeError", "TypeError", "TypeError", "TypeError", true, true, true, true, false, true, false, true, ["echo", "fail", "sleep", "text"], true]}
// tools is built a piece at a time; before and after a read, every write is refused as on a
// frozen object, and the first observation of the whole object sees it frozen.
const refused = (f) => { try { f(); return 'allowed' } catch (e) { return e.name } };
return [
  refused(() => { tools.added = 1 }),
  refused(() => { tools.examples.echo = 1 }),
  refused(() => { Object.defineProperty(tools.examples, 'extra', {value: 1}) }),
  refused(() => { delete tools.examples }),
  refused(() => { Object.setPrototypeOf(tools, {}) }),
  refused(() => { tools['examples.echo'] = null }),
  Object.freeze(tools) === tools,
  Object.isFrozen(tools.examples),
  Object.getPrototypeOf(tools) === null,
  'sleep' in tools.examples,
  'nothing' in tools.examples,
  delete tools.nothing,
  Object.isExtensible(tools),
  tools.examples.echo === tools['examples.echo'],
  Object.keys(tools.examples).sort(),
  Object.getOwnPropertyDescriptor(tools.examples, 'text').writable === false,
];
