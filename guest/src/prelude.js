// The realm's prelude, evaluated once while the guest is pre-initialized (before any user code
// exists). It captures the intrinsics it needs, so scripts that later replace `Object.freeze`,
// `JSON.stringify` or a prototype method cannot change how `tools`, `user`, `console` and `log`
// behave, and defines those four globals. `user` is built the first time a script reads it, from
// what `sessionNative()` returns; `tools` is built a piece at a time (see `namespace`), so
// capabilities a script never reaches cost it nothing, however large the catalog.
(function (callNative, bindNative, logNative, sessionNative, toolsNatives, shownJson) {
  "use strict";
  const toolsEntry = toolsNatives[0], toolsNames = toolsNatives[1], markNamespace = toolsNatives[2];
  const { freeze, defineProperty, getPrototypeOf, create, keys, hasOwn } = Object;
  const ProxyCtor = Proxy;
  const {
    defineProperty: reflectDefineProperty, deleteProperty: reflectDeleteProperty,
    getOwnPropertyDescriptor: reflectGetOwnPropertyDescriptor, isExtensible: reflectIsExtensible,
    ownKeys: reflectOwnKeys, preventExtensions: reflectPreventExtensions,
    setPrototypeOf: reflectSetPrototypeOf,
  } = Reflect;
  const isArray = Array.isArray;
  const stringify = JSON.stringify;
  const toStr = String;
  const PromiseReject = Promise.reject.bind(Promise);
  const ObjectProto = Object.prototype;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  // No prototype: a level is looked up among these four names only (not `toString`).
  const LEVELS = freeze({ __proto__: null, debug: 0, info: 1, warn: 2, error: 3 });

  // V8-style call sites would hand scripts the prelude's own functions (and the natives they
  // call) through `getFunction()`; QuickJS only builds them when this was set, so it is fixed
  // to `undefined` before any script runs. Assigning it throws in strict mode.
  defineProperty(ErrorCtor, "prepareStackTrace", {
    __proto__: null, value: undefined, writable: false, enumerable: false, configurable: false,
  });

  function describe(value) {
    if (typeof value === "string") return value;
    if (value instanceof ErrorCtor) {
      const stack = value.stack;
      const head = `${value.name}: ${value.message}`;
      return typeof stack === "string" && stack.length > 0 ? `${head}\n${stack}` : head;
    }
    if (typeof value === "function") return `[Function ${value.name || "anonymous"}]`;
    if (value === undefined || typeof value === "symbol" || typeof value === "bigint") {
      return toStr(value);
    }
    try {
      const text = stringify(value);
      // JSON.stringify writes a lone surrogate as a `\ud800` escape; a log shows U+FFFD, as
      // results, errors and strings logged on their own do.
      return text === undefined ? toStr(value) : shownJson(text);
    } catch (_) {
      return toStr(value);
    }
  }

  function emit(level, args) {
    let message = "";
    for (let i = 0; i < args.length; i++) {
      if (i > 0) message += " ";
      message += describe(args[i]);
    }
    logNative(LEVELS[level], message, undefined);
  }

  const console = freeze({
    log: freeze(function log(...args) { emit("info", args); }),
    info: freeze(function info(...args) { emit("info", args); }),
    debug: freeze(function debug(...args) { emit("debug", args); }),
    warn: freeze(function warn(...args) { emit("warn", args); }),
    error: freeze(function error(...args) { emit("error", args); }),
  });

  // log(level, message, fields): a structured record; fields must be a plain JSON object.
  const log = freeze(function log(level, message, fields) {
    if (typeof level !== "string" || !(level in LEVELS)) {
      throw new TypeErrorCtor('log(level, message, fields): level must be "debug", "info", "warn" or "error"');
    }
    let fieldsJson = undefined;
    if (fields !== undefined && fields !== null) {
      if (typeof fields !== "object" || isArray(fields)) {
        throw new TypeErrorCtor("log(level, message, fields): fields must be an object");
      }
      fieldsJson = stringify(fields);
      // A `toJSON` may turn the object into anything; only an object is recorded as fields.
      if (typeof fieldsJson !== "string" || fieldsJson[0] !== "{") {
        throw new TypeErrorCtor("log(level, message, fields): fields must serialize to a JSON object");
      }
    }
    logNative(LEVELS[level], describe(message), fieldsJson);
  });

  // A binding's function is native (`bindNative`): it starts the call itself when it gets no
  // argument, `undefined` or an object literal's kind of object, and hands anything else to
  // `check`, with the same outcome it would have had here. Every failure rejects, never
  // throws: a Proxy whose traps throw, a `toJSON` or `toString` that throws, an argument too
  // deep for the boundary. The argument must be a plain object: no array, and a prototype
  // that is `Object.prototype` or none.
  function bindCapability(index, id) {
    const check = function (input) {
      try {
        if (arguments.length > 1) {
          return PromiseReject(new TypeErrorCtor(`${id} takes one object argument, got ${arguments.length}`));
        }
        // No argument and `undefined` never reach here: `bindNative`'s function sends `{}`.
        let proto;
        if (input === null || typeof input !== "object" || isArray(input) ||
            ((proto = getPrototypeOf(input)) !== null && proto !== ObjectProto)) {
          return PromiseReject(new TypeErrorCtor(`${id} takes one object argument, got ${describe(input)}`));
        }
        return callNative(index, input);
      } catch (error) {
        return PromiseReject(error);
      }
    };
    const fn = bindNative(index, check);
    // The check is named too: its frame shows in the stack of the TypeError it rejects with.
    NAME.value = id;
    defineProperty(check, "name", NAME);
    defineProperty(fn, "name", NAME);
    NAME.value = undefined;
    return freeze(fn);
  }

  // Descriptors without a prototype (a script's `Object.prototype.get` must not join them),
  // made once and refilled for each binding: enumerating 10,000 capabilities makes 10,000
  // functions, and the descriptors were a fifth of their cost. Nothing a script can reach holds
  // them, and filling one and using it run no script code in between.
  const NAME = { __proto__: null, value: undefined };
  // Every trap a namespace's handler has, removed once its target is complete.
  const TRAPS = freeze([
    "get", "has", "getOwnPropertyDescriptor", "ownKeys", "defineProperty", "deleteProperty",
    "set", "isExtensible", "preventExtensions", "setPrototypeOf",
  ]);
  const BOUND = { __proto__: null, value: undefined, writable: false, enumerable: true, configurable: false };

  // Indexed loops only: `for...of` would call Array.prototype[Symbol.iterator], which a script
  // may have replaced before it first reads `tools`.
  function deepFreeze(value) {
    if (value !== null && typeof value === "object") {
      const names = keys(value);
      for (let i = 0; i < names.length; i++) deepFreeze(value[names[i]]);
      freeze(value);
    }
    return value;
  }

  function define(name, value) {
    defineProperty(globalThis, name, { __proto__: null, value, writable: false, enumerable: false, configurable: false });
  }

  // `console` and `log` do not depend on the session, so they are defined now, while the guest
  // is pre-initialized, and every session starts with them.
  define("console", console);
  define("log", log);

  // `tools` and each namespace under it: a Proxy over a null-prototype target that starts
  // empty. Reading or testing one name asks the host's tree (`toolsEntry`) for that name alone
  // and defines it on the target, non-writable and non-configurable, so every later read sees
  // the same value. Anything that observes the whole object (enumerating it, asking for a
  // descriptor's neighbours, freezing, extending, deleting, setting, changing its prototype)
  // first completes the target and freezes it, then answers exactly as a frozen object would.
  // So `tools` behaves as the deeply frozen object it always was, and costs in proportion to
  // what the script reaches, not to the catalog. `functions` holds each binding's function by
  // index, so its JS path and its canonical id give the same function. `markNamespace` lets
  // QuickJS answer a name the target already holds without calling the `get` trap, which
  // would return that same value (see `JS_CorralMarkNamespace`): the path of every call.
  function namespace(node, functions) {
    const target = create(null);
    let complete = false;
    function materialize(name) {
      const entry = toolsEntry(node, name);
      if (entry === undefined) return undefined;
      let value;
      if (entry[0] === 0) {
        const index = entry[1];
        value = functions[index];
        if (value === undefined) value = functions[index] = bindCapability(index, entry[2]);
      } else {
        value = namespace(entry[1], functions);
      }
      BOUND.value = value;
      defineProperty(target, name, BOUND);
      BOUND.value = undefined;
      return value;
    }
    // The target has no prototype, so `target[name]` reads its own properties only.
    function lookup(name) {
      if (typeof name !== "string") return undefined;
      const value = target[name];
      return value !== undefined || complete ? value : materialize(name);
    }
    function completeTarget() {
      if (complete) return;
      const names = toolsNames(node);
      for (let i = 0; i < names.length; i++) lookup(names[i]);
      complete = true;
      freeze(target);
      // Complete and frozen, the target answers everything exactly as the proxy would: the
      // handler is emptied, so the engine finds no trap and asks the target itself, natively.
      for (let i = 0; i < TRAPS.length; i++) reflectDeleteProperty(handler, TRAPS[i]);
    }
    // No prototype: a trap a script puts on `Object.prototype` must not join these. The traps
    // that observe the whole object are getters: the engine reads a trap from the handler
    // before it touches the target, so reading one completes the target, and answering
    // `undefined` (no trap) lets the engine ask the completed target itself. So enumerating
    // costs the bindings it makes and nothing more: an `ownKeys` trap's answer is checked
    // against the target's keys in quadratic time (1.5 billion fuel for 10,000 names), the
    // target's own answer is not. No script can reach the handler.
    const handler = {
      __proto__: null,
      // The path every call takes (`tools.x.y(...)`), so it does not call `lookup`.
      get(_target, name) {
        const value = target[name];
        return value !== undefined || complete || typeof name !== "string" ? value : materialize(name);
      },
      has(_target, name) { return lookup(name) !== undefined; },
      getOwnPropertyDescriptor(_target, name) {
        lookup(name);
        return plainDescriptor(reflectGetOwnPropertyDescriptor(target, name));
      },
      get ownKeys() { completeTarget(); return undefined; },
      get defineProperty() { completeTarget(); return undefined; },
      get deleteProperty() { completeTarget(); return undefined; },
      get set() { completeTarget(); return undefined; },
      get isExtensible() { completeTarget(); return undefined; },
      get preventExtensions() { completeTarget(); return undefined; },
      get setPrototypeOf() { completeTarget(); return undefined; },
    };
    const proxy = new ProxyCtor(target, handler);
    markNamespace(proxy);
    return proxy;
  }

  // A property descriptor that crosses a proxy trap, copied without a prototype: the engine
  // reads `get` and `set` from descriptors, and would find a script's `Object.prototype.get`.
  const DESCRIPTOR_FIELDS = freeze(["value", "writable", "get", "set", "enumerable", "configurable"]);
  function plainDescriptor(descriptor) {
    if (descriptor === undefined) return undefined;
    const copy = create(null);
    for (let i = 0; i < DESCRIPTOR_FIELDS.length; i++) {
      const field = DESCRIPTOR_FIELDS[i];
      if (hasOwn(descriptor, field)) copy[field] = descriptor[field];
    }
    return copy;
  }

  function buildTools() {
    return namespace(0, create(null));
  }

  // `tools` is made now, empty: every session starts from this snapshot and fills its own copy
  // from its own bindings as it reads names. A data property, so reading it calls nothing.
  define("tools", buildTools());

  // A read-only global whose value is computed on first read. Without a setter, assigning to
  // it throws in strict mode (scripts run in strict mode); it cannot be redefined.
  let userValue;
  let userRead = false;
  defineProperty(globalThis, "user", {
    __proto__: null,
    get: freeze(function user() {
      if (!userRead) {
        const user = sessionNative();
        userValue = user === null ? null : deepFreeze(user);
        userRead = true;
      }
      return userValue;
    }),
    enumerable: false,
    configurable: false,
  });

  // For the pre-initialization warm-up only: reaches into a `tools` built on the sample tree
  // the guest installed for the occasion, and freezes a sample user, so those code paths are
  // warm in the snapshot; defines nothing.
  return function warmUp(user) {
    const tools = buildTools();
    void tools.warm.up.one;
    void tools["warm.two"];
    void ("warm" in tools);
    void reflectOwnKeys(tools.warm);
    deepFreeze(user);
  };
})
