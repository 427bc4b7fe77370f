// The realm's prelude, evaluated once while the guest is pre-initialized (before any user code
// exists). It captures the intrinsics it needs, so scripts that later replace `Object.freeze`,
// `JSON.stringify` or a prototype method cannot change how `tools`, `user`, `console` and `log`
// behave, and defines those four globals. `tools` and `user` are built the first time a script
// reads them, from what `sessionNative()` returns; sessions that never use them pay nothing.
(function (callNative, logNative, sessionNative) {
  "use strict";
  const { freeze, defineProperty, getPrototypeOf, create, keys } = Object;
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
      return text === undefined ? toStr(value) : text;
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

  function isPlainObject(value) {
    if (value === null || typeof value !== "object" || isArray(value)) return false;
    const proto = getPrototypeOf(value);
    return proto === null || proto === ObjectProto;
  }

  function bindCapability(index, id) {
    // Every failure rejects, never throws: a Proxy whose traps throw, a `toJSON` or
    // `toString` that throws, an argument too deep for the boundary.
    const fn = function (input) {
      try {
        if (arguments.length > 1) {
          return PromiseReject(new TypeErrorCtor(`${id} takes one object argument, got ${arguments.length}`));
        }
        if (arguments.length === 0 || input === undefined) input = {};
        if (!isPlainObject(input)) {
          return PromiseReject(new TypeErrorCtor(`${id} takes one object argument, got ${describe(input)}`));
        }
        return callNative(index, input);
      } catch (error) {
        return PromiseReject(error);
      }
    };
    // Descriptors without a prototype: a script's `Object.prototype.get` must not join them.
    defineProperty(fn, "name", { __proto__: null, value: id });
    return freeze(fn);
  }

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

  // Builds the `tools` object from the bindings ([[id, [parts...]], ...]); pure, so it can also
  // be run on sample bindings while the guest is pre-initialized, to warm its code paths.
  function buildTools(bindings) {
    const tools = create(null);
    for (let index = 0; index < bindings.length; index++) {
      const binding = bindings[index];
      const id = binding[0];
      const path = binding[1];
      const fn = bindCapability(index, id);
      let node = tools;
      for (let i = 0; i < path.length - 1; i++) {
        const part = path[i];
        if (node[part] === undefined) node[part] = create(null);
        else if (typeof node[part] !== "object") {
          throw new ErrorCtor(`capability ${id}: js path collides with another capability at ${part}`);
        }
        node = node[part];
      }
      const last = path[path.length - 1];
      if (node[last] !== undefined) {
        throw new ErrorCtor(`capability ${id}: js path collides with another capability`);
      }
      node[last] = fn;
      if (tools[id] === undefined) tools[id] = fn;
      else if (tools[id] !== fn) {
        throw new ErrorCtor(`capability ${id}: canonical id collides with a js path`);
      }
    }
    return deepFreeze(tools);
  }

  // Read-only globals whose value is computed on first read. Without a setter, assigning to
  // them throws in strict mode (scripts run in strict mode); they cannot be redefined.
  let session = null;
  function sessionValue(name) {
    if (session === null) {
      const state = sessionNative();
      const user = state[1];
      session = freeze({ tools: buildTools(state[0]), user: user === null ? null : deepFreeze(user) });
    }
    return session[name];
  }
  defineProperty(globalThis, "tools", {
    __proto__: null,
    get: freeze(function tools() { return sessionValue("tools"); }),
    enumerable: false,
    configurable: false,
  });
  defineProperty(globalThis, "user", {
    __proto__: null,
    get: freeze(function user() { return sessionValue("user"); }),
    enumerable: false,
    configurable: false,
  });

  // For the pre-initialization warm-up only: builds tools and a user from samples, so those
  // code paths are warm in the snapshot, and defines nothing.
  return function warmUp(bindings, user) {
    buildTools(bindings);
    deepFreeze(user);
  };
})
