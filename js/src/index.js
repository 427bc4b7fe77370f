// corral's sandbox for Node: model-written scripts run in the QuickJS guest component (transpiled
// by jco into gen/), one worker thread per session, with async JS functions as capabilities.
//
//   const sandbox = createSandbox()
//   const session = await sandbox.session({ tools: { 'weather.now': async ({ city }) => ({ c: 21 }) } })
//   const report = await session.run('return (await tools.weather.now({ city: "Oslo" })).c')
//   // report: { ok: true, value: 21, logs: [], stats: { fuel: 0, wall_us, peak_memory_bytes, calls: 1 } }
//
// Core concepts:
// - Sandbox: compiles the guest's core modules once (one per memory cap, see memoryModule) and
//   keeps started workers ready (a spare one, and those closed sessions gave back). An idle
//   worker instantiates a fresh guest ahead of time, so that a new session usually only
//   initializes it.
// - Session: one guest instance in its own worker. The guest runs there; tools run here, on the
//   main thread. The worker posts each call the guest starts (`host.start-call`) at once, so the
//   calls of a `Promise.all` are all in flight together; finished calls go back as one `resume`
//   batch whenever the guest is waiting (the loop documented in wit/sandbox.wit).
// - Limits: the same fields as the Rust host's SessionLimits. The deadline terminates the worker;
//   memory, call counts and log sizes trap inside the worker's imports; results and scripts are
//   measured here. Fuel cannot be metered by a JS engine (see README.md).
// - Reports: `{ok, value | error: {kind, message, ...}, logs, stats}`, exactly as `corral exec`
//   prints them, with the Rust host's error kinds.
import { readFileSync } from 'node:fs'
import { Worker } from 'node:worker_threads'

import { loadCatalog, validateInput } from './catalog.js'

export { exampleCatalog, exampleTools } from './examples.js'
export { CatalogError } from './catalog.js'

const GEN = new URL('../gen/', import.meta.url)
const CORE_MODULES = ['corral-guest.core.wasm', 'corral-guest.core2.wasm', 'corral-guest.core3.wasm']
const PAGE = 64 << 10
/** Workers of closed sessions kept for new sessions. */
const MAX_IDLE_WORKERS = 2

/** The maximum the guest's linear memory declares; no session may have a larger cap. */
export const GUEST_MAX_MEMORY_BYTES = 1 << 30

/** Defaults of every limit, the Rust host's SessionLimits::default(). */
export const DEFAULT_LIMITS = Object.freeze({
  fuel: 2_000_000_000,
  timeout_ms: 30_000,
  memory_bytes: 64 << 20,
  max_concurrent_calls: 8,
  max_total_calls: 1_000,
  max_result_bytes: 1 << 20,
  max_log_bytes: 256 << 10,
  max_script_bytes: 256 << 10,
})

/** The error kind of each limit, as the Rust host's `Limit::kind`. */
const LIMIT_KINDS = {
  fuel: 'fuel_exhausted',
  deadline: 'deadline_exceeded',
  memory: 'memory_limit',
  stack: 'stack_overflow',
  total_calls: 'too_many_calls',
  result_size: 'result_too_large',
  log_size: 'logs_too_large',
}

/**
 * Creates a sandbox: the guest compiled once, ready for sessions.
 * @param {import('./index.js').SandboxOptions} [options]
 */
export function createSandbox(options = {}) {
  return new Sandbox(options)
}

class Sandbox {
  #stackSizeMb
  #spareWorkers
  #core = null
  #modulesByCap = new Map()
  /** Started workers holding no guest: a spare one, and those of closed sessions. */
  #idle = []
  #closed = false

  constructor({ stackSizeMb = 4, spareWorker = true, ...rest } = {}) {
    rejectUnknown('sandbox option', rest)
    this.#stackSizeMb = stackSizeMb
    this.#spareWorkers = spareWorker
  }

  /**
   * Creates a session: a fresh guest instance with the tools bound.
   * @param {import('./index.js').SessionOptions} [options]
   */
  async session(options = {}) {
    if (this.#closed) throw new Error('the sandbox is closed')
    const session = new Session(this, options)
    try {
      await session.start()
    } catch (error) {
      // Its worker must not linger: it holds a guest that refused the bindings.
      session.close()
      throw error
    }
    return session
  }

  /** Stops the idle workers. Sessions already created keep working until they are closed. */
  close() {
    this.#closed = true
    for (const worker of this.#idle.splice(0)) void worker.terminate()
  }

  /** The compiled core modules for a session whose memory cap is `capBytes`. @internal */
  modulesFor(capBytes) {
    this.#core ??= CORE_MODULES.map((name) => readFileSync(new URL(name, GEN)))
    let modules = this.#modulesByCap.get(capBytes)
    if (!modules) {
      modules = {
        [CORE_MODULES[0]]: new WebAssembly.Module(memoryModule(this.#core[0], capBytes)),
        [CORE_MODULES[1]]: new WebAssembly.Module(this.#core[1]),
        [CORE_MODULES[2]]: new WebAssembly.Module(this.#core[2]),
      }
      this.#modulesByCap.set(capBytes, modules)
    }
    return modules
  }

  /** A started worker for a new guest instance (an idle one when there is one). @internal */
  takeWorker() {
    // The longest idle first: it has had the most time to prepare its instance.
    const worker = this.#idle.shift() ?? this.#spawn()
    if (this.#spareWorkers && !this.#closed && this.#idle.length === 0) this.#idle.push(this.#spawn())
    return worker
  }

  /**
   * Takes back the worker of a closed session whose guest did not trap or overrun: it has
   * dropped its instance, so the next session instantiates a fresh guest in it without paying
   * for a new thread. Nothing of the old session's guest survives but garbage.
   * @internal
   */
  recycleWorker(worker, capBytes) {
    if (this.#closed || this.#idle.length >= MAX_IDLE_WORKERS) {
      void worker.terminate()
      return
    }
    worker.postMessage({ type: 'drop' })
    this.#prepare(worker, capBytes)
    worker.unref()
    this.#idle.push(worker)
  }

  /** Has an idle worker instantiate a fresh guest for the next session with this cap. */
  #prepare(worker, capBytes) {
    worker.postMessage({ type: 'prepare', capBytes, modules: this.modulesFor(capBytes) })
  }

  #spawn() {
    const worker = new Worker(new URL('./worker.js', import.meta.url), {
      resourceLimits: { stackSizeMb: this.#stackSizeMb },
      stdout: false,
      stderr: false,
    })
    // An idle worker must not keep the process alive; a session refs it while it runs.
    worker.unref()
    this.#prepare(worker, DEFAULT_LIMITS.memory_bytes)
    return worker
  }
}

/**
 * The core module with its memory's declared maximum lowered from 1 GiB to the cap plus the same
 * again as headroom (at most 1 GiB). A JS engine has no hook on `memory.grow`, so the cap cannot
 * trap at the moment growth crosses it as under wasmtime; instead growth may pass the cap into
 * the headroom, and the worker stops the script as soon as it calls out or returns (see
 * README.md). The headroom is what lets a script that catches an out-of-memory error still be
 * seen over the cap: only a single allocation larger than the cap itself fails below it.
 */
function memoryModule(bytes, capBytes) {
  const maxPages = Math.min(GUEST_MAX_MEMORY_BYTES / PAGE, Math.ceil((2 * capBytes) / PAGE))
  const sections = []
  let p = 8
  const leb = () => {
    let result = 0
    let shift = 0
    let byte
    do {
      byte = bytes[p++]
      result += (byte & 0x7f) * 2 ** shift
      shift += 7
    } while (byte & 0x80)
    return result
  }
  while (p < bytes.length) {
    const start = p
    const id = bytes[p++]
    const size = leb()
    const body = p
    p += size
    if (id !== 5) {
      sections.push(bytes.subarray(start, p))
      continue
    }
    const savedEnd = p
    p = body
    const count = leb()
    const flags = bytes[p++]
    if (count !== 1 || (flags & ~1) !== 0) throw new Error('the guest core module does not have one plain 32-bit memory')
    const minPages = leb()
    if (flags & 1) leb()
    const content = Buffer.concat([encodeLeb(1), Buffer.from([1]), encodeLeb(minPages), encodeLeb(Math.max(minPages, maxPages))])
    sections.push(Buffer.concat([Buffer.from([5]), encodeLeb(content.length), content]))
    p = savedEnd
  }
  return Buffer.concat([bytes.subarray(0, 8), ...sections])
}

function encodeLeb(value) {
  const out = []
  do {
    let byte = value & 0x7f
    value = Math.floor(value / 128)
    if (value > 0) byte |= 0x80
    out.push(byte)
  } while (value > 0)
  return Buffer.from(out)
}

function rejectUnknown(what, rest) {
  const unknown = Object.keys(rest)
  if (unknown.length > 0) throw new TypeError(`unknown ${what} ${JSON.stringify(unknown[0])}`)
}

function checkLimits(limits) {
  const merged = { ...DEFAULT_LIMITS }
  for (const [key, value] of Object.entries(limits ?? {})) {
    if (!(key in DEFAULT_LIMITS)) throw new TypeError(`unknown limit ${JSON.stringify(key)}`)
    if (!Number.isSafeInteger(value) || value < 0) throw new TypeError(`limit ${key} must be a non-negative integer, not ${value}`)
    merged[key] = value
  }
  if (merged.memory_bytes > GUEST_MAX_MEMORY_BYTES) {
    throw new TypeError(`memory_bytes ${merged.memory_bytes} is above the guest's maximum of ${GUEST_MAX_MEMORY_BYTES}`)
  }
  merged.max_concurrent_calls = Math.max(1, merged.max_concurrent_calls)
  return merged
}

/** `{'a.b': fn}` and `{a: {b: fn}}` alike, as a map from capability id to function. */
function flattenTools(tools, prefix = [], out = new Map()) {
  for (const [key, value] of Object.entries(tools ?? {})) {
    const path = [...prefix, key]
    if (typeof value === 'function') out.set(path.join('.'), value)
    else if (typeof value === 'object' && value !== null) flattenTools(value, path, out)
    else throw new TypeError(`tool ${path.join('.')} is not a function`)
  }
  return out
}

function checkUser(user) {
  if (user === undefined || user === null) return undefined
  const { id, email, displayName, ...rest } = user
  rejectUnknown('user field', rest)
  if (typeof id !== 'string') throw new TypeError('user.id must be a string')
  for (const [name, value] of [['email', email], ['displayName', displayName]]) {
    if (value !== undefined && value !== null && typeof value !== 'string') throw new TypeError(`user.${name} must be a string`)
  }
  return { id, email: email ?? undefined, displayName: displayName ?? undefined }
}

function guestClock(clock) {
  if (clock === undefined) return { tag: 'frozen', val: 0n }
  if (clock === 'real') return { tag: 'host' }
  if (typeof clock === 'object' && clock !== null && clock.frozen && Number.isSafeInteger(clock.frozen.unix_ms)) {
    return { tag: 'frozen', val: BigInt(clock.frozen.unix_ms) }
  }
  throw new TypeError('clock must be "real" or {frozen: {unix_ms}}')
}

function randomSeed(entropy) {
  if (entropy === undefined) return 0n
  if (entropy === 'host') {
    const bytes = new BigUint64Array(1)
    crypto.getRandomValues(bytes)
    return bytes[0]
  }
  if (typeof entropy === 'object' && entropy !== null && entropy.seeded) {
    return BigInt.asUintN(64, BigInt(entropy.seeded.seed))
  }
  throw new TypeError('entropy must be "host" or {seeded: {seed}}')
}

const utf8Length = (text) => Buffer.byteLength(text, 'utf8')

/** JSON text from the guest. `JSON.stringify` in the guest writes lone surrogates as escapes;
 * like the Rust host, they become U+FFFD. */
function parseGuestJson(text) {
  const value = JSON.parse(text)
  return /\\u[dD][89a-fA-F]/.test(text) ? wellFormed(value) : value
}

function wellFormed(value) {
  if (typeof value === 'string') return value.toWellFormed()
  if (Array.isArray(value)) return value.map(wellFormed)
  if (typeof value === 'object' && value !== null) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k.toWellFormed(), wellFormed(v)]))
  }
  return value
}

/** The error kind of a script error, by its name (the Rust host's `ExecError::kind`). */
/** The kind of a script error that is a call rejection the host delivered. */
function scriptErrorKind(name) {
  if (name === 'ValidationError') return 'invalid_input'
  if (name === 'CapabilityError') return 'capability_error'
  return 'script_error'
}

class Session {
  #sandbox
  #id
  #limits
  #bindings
  #config
  #worker = null
  /** Whether the worker holds a live, initialized guest instance. */
  #ready = false
  #listener = null
  #detach = null
  /** Whether a script is running (its worker is then not recycled on close). */
  #running = false
  #scriptsRun = 0
  #queue = Promise.resolve()
  #closed = false

  constructor(sandbox, { tools, catalog, user, limits, id = '', clock, entropy, ...rest } = {}) {
    rejectUnknown('session option', rest)
    this.#sandbox = sandbox
    this.#id = String(id)
    this.#limits = checkLimits(limits)
    const functions = flattenTools(tools)
    if (catalog !== undefined) {
      // The catalog decides what is bound (and validated); a capability without a function
      // fails when called, as a Rust backend answers an unknown capability.
      const loaded = loadCatalog(catalog)
      this.#bindings = loaded.capabilities.map((capability) => ({ ...capability, fn: functions.get(capability.id) }))
    } else {
      this.#bindings = [...functions].map(([id, fn]) => ({ id, jsPath: id.split('.'), textOutput: false, validate: null, fn }))
    }
    this.#config = {
      bindings: this.#bindings.map(({ id, jsPath }) => {
        const derived = jsPath.length === id.split('.').length && jsPath.every((part, i) => part === id.split('.')[i])
        return derived ? { id } : { id, jsPath }
      }),
      user: checkUser(user),
      randomSeed: randomSeed(entropy),
      clock: guestClock(clock),
      maxResultBytes: BigInt(this.#limits.max_result_bytes),
    }
  }

  /** The session id given at creation; it prefixes every script id and tool call id. */
  get id() {
    return this.#id
  }

  /** Instantiates a fresh guest in the worker (starting a worker when there is none). @internal */
  async start() {
    if (this.#worker === null) {
      this.#worker = this.#sandbox.takeWorker()
      const worker = this.#worker
      const onMessage = (message) => this.#listener?.(message)
      const onError = (error) => this.#listener?.({ type: 'worker-error', error })
      const onExit = () => {
        if (this.#worker === worker) {
          this.#worker = null
          this.#ready = false
          this.#listener?.({ type: 'worker-exit' })
        }
      }
      worker.on('message', onMessage)
      worker.on('error', onError)
      worker.on('exit', onExit)
      this.#detach = () => {
        worker.off('message', onMessage)
        worker.off('error', onError)
        worker.off('exit', onExit)
      }
    }
    const worker = this.#worker
    worker.ref()
    try {
      await new Promise((resolve, reject) => {
        this.#listener = (message) => {
          if (message.type === 'ready') resolve()
          else if (message.type === 'init-failed') reject(new Error(`binding the capabilities failed: ${message.message}`))
          else if (message.type === 'worker-error') reject(message.error)
          else if (message.type === 'worker-exit') reject(new Error('the worker exited while the guest started'))
        }
        worker.postMessage({
          type: 'instantiate',
          modules: this.#sandbox.modulesFor(this.#limits.memory_bytes),
          config: this.#config,
          limits: this.#limits,
        })
      })
      this.#ready = true
    } finally {
      this.#listener = null
      worker.unref()
    }
  }

  /**
   * Runs one script (the body of an async function). Never rejects: every outcome is a report.
   * Scripts of one session run one after another; `globalThis` carries over between them until
   * a limit or trap replaces the guest instance with a fresh one.
   * @param {string} source
   */
  run(source) {
    const report = this.#queue.then(() => this.#run(String(source)))
    this.#queue = report.catch(() => {})
    return report
  }

  /** Ends the session: its worker is terminated and calls still running are abandoned. */
  close() {
    if (this.#closed) return
    this.#closed = true
    const worker = this.#worker
    this.#worker = null
    if (!worker) return
    this.#detach?.()
    if (this.#ready && !this.#running) this.#sandbox.recycleWorker(worker, this.#limits.memory_bytes)
    else void worker.terminate()
    this.#ready = false
  }

  async #run(source) {
    const started = performance.now()
    const scriptId = `${this.#id}:${this.#scriptsRun}`
    this.#scriptsRun += 1
    const failed = (error, stats = { calls: 0, memoryBytes: 0 }) => ({
      ok: false,
      error,
      logs: [],
      stats: { fuel: 0, wall_us: Math.round((performance.now() - started) * 1000), peak_memory_bytes: stats.memoryBytes, calls: stats.calls },
    })
    if (this.#closed) return failed({ kind: 'session_discarded', message: 'the session was closed' })
    const size = utf8Length(source)
    if (size > this.#limits.max_script_bytes) {
      return failed({
        kind: 'invalid_input',
        message: `invalid script: the script is ${size} bytes, over the ${this.#limits.max_script_bytes} byte limit`,
      })
    }
    if (!this.#ready) {
      try {
        await this.start()
      } catch (error) {
        return failed({ kind: 'internal_error', message: `the host failed: starting a fresh guest failed: ${error.message}` })
      }
    }
    const worker = this.#worker
    worker.ref()
    this.#running = true
    try {
      return await new ScriptRun(this.#bindings, this.#limits, this.#id, scriptId, started).drive(
        worker,
        source,
        (listener) => {
          this.#listener = listener
        },
        (how) => {
          // A trap dropped the instance; a deadline (or a dead worker) takes the worker too.
          this.#ready = false
          if (how === 'terminate' && this.#worker === worker) {
            this.#worker = null
            void worker.terminate()
          }
        },
      )
    } finally {
      this.#running = false
      this.#listener = null
      worker.unref()
    }
  }
}

/** One script's run: the host side of the resumable loop, its calls and its report. */
class ScriptRun {
  #bindings
  #limits
  #sessionId
  #scriptId
  #started
  #logs = []
  #calls = 0
  /** `[name, message, toolCallId]` of every call rejection delivered to the guest: only these
   * make a script error a `capability_error` or `invalid_input` (the kind follows what the host
   * knows, never a name the script chose). */
  #rejections = []
  #memoryBytes = 0
  /** Completions of finished calls not yet delivered, in finishing order. */
  #ready = []
  /** Validated calls waiting for a free slot (max_concurrent_calls). */
  #queued = []
  /** Abort controllers of calls whose tools are running. */
  #running = new Map()
  #guestWaiting = false
  #finished = false

  constructor(bindings, limits, sessionId, scriptId, started) {
    this.#bindings = bindings
    this.#limits = limits
    this.#sessionId = sessionId
    this.#scriptId = scriptId
    this.#started = started
  }

  drive(worker, source, listen, discard) {
    return new Promise((resolve) => {
      const finish = (outcome, how) => {
        if (this.#finished) return
        this.#finished = true
        clearTimeout(timer)
        for (const controller of this.#running.values()) controller.abort()
        if (how) discard(how)
        resolve(this.#report(outcome))
      }
      const limit = (limitName, message) => ({
        error: { kind: LIMIT_KINDS[limitName], message, limit: limitName, calls_started: this.#calls },
      })
      const timer = setTimeout(() => {
        const message = this.#guestWaiting
          ? "the script's deadline passed while it waited on capability calls"
          : 'the script ran past its deadline'
        finish(limit('deadline', message), 'terminate')
      }, this.#limits.timeout_ms)
      this.deliver = () => {
        if (!this.#guestWaiting || this.#ready.length === 0) return
        this.#guestWaiting = false
        const completions = this.#ready
        this.#ready = []
        for (const { outcome } of completions) {
          if (outcome.tag === 'err') this.#rejections.push([outcome.val.name, outcome.val.message, outcome.val.toolCallId])
        }
        worker.postMessage({ type: 'resume', completions })
      }
      listen((message) => {
        if (this.#finished) return
        switch (message.type) {
          case 'call':
            this.#calls += 1
            this.#startCall(message)
            break
          case 'log':
            this.#logs.push({
              script_id: this.#scriptId,
              level: message.level,
              message: message.message,
              ...(message.fieldsJson === undefined ? {} : { fields: tryParse(message.fieldsJson) }),
            })
            break
          case 'state':
            this.#memoryBytes = message.memoryBytes
            if (message.state === 'done') {
              finish(this.#done(message.result))
            } else if (message.state === 'result-too-large') {
              finish({
                error: {
                  kind: 'result_too_large',
                  message: `the result's JSON text is over the ${this.#limits.max_result_bytes} byte limit (serializing stopped there)`,
                  limit: 'result_size',
                  calls_started: this.#calls,
                },
              })
            } else if (this.#ready.length === 0 && this.#running.size === 0 && this.#queued.length === 0) {
              finish({ error: { kind: 'internal_error', message: 'the host failed: the guest waited for completions with no call pending' } }, 'drop')
            } else {
              this.#guestWaiting = true
              this.deliver()
            }
            break
          case 'trap':
            this.#memoryBytes = message.memoryBytes
            finish(message.limit ? limit(message.limit, message.message) : { error: { kind: message.kind, message: message.message } }, 'drop')
            break
          case 'worker-error':
            finish({ error: { kind: 'internal_error', message: `the host failed: the worker failed: ${message.error?.message ?? message.error}` } }, 'terminate')
            break
          case 'worker-exit':
            finish({ error: { kind: 'internal_error', message: 'the host failed: the worker exited' } }, 'terminate')
            break
          default:
            break
        }
      })
      worker.postMessage({ type: 'run', source, scriptId: this.#scriptId })
    })
  }

  /** Registers a call the guest started: rejected at once when its input is invalid (the tool
   * never sees it), else queued behind the concurrency bound. */
  #startCall({ callId, binding: index, argsJson }) {
    const toolCallId = `${this.#scriptId}:${callId}`
    const reject = (name, message) => this.#complete({ callId, outcome: { tag: 'err', val: { name, message, toolCallId } } })
    const binding = this.#bindings[index]
    if (!binding) return reject('CapabilityError', `no capability is bound at index ${index}`)
    let args
    try {
      args = parseGuestJson(argsJson)
    } catch {
      args = undefined
    }
    if (!Array.isArray(args) || args.length !== 1) return reject('ValidationError', `${binding.id} takes one object argument`)
    if (binding.validate) {
      const invalid = validateInput(binding, args[0])
      if (invalid !== null) return reject('ValidationError', invalid)
    }
    this.#queued.push({ callId, binding, input: args[0], toolCallId })
    this.#pump()
  }

  #pump() {
    while (this.#running.size < this.#limits.max_concurrent_calls && this.#queued.length > 0) {
      const call = this.#queued.shift()
      const controller = new AbortController()
      this.#running.set(call.callId, controller)
      const context = {
        capabilityId: call.binding.id,
        toolCallId: call.toolCallId,
        sessionId: this.#sessionId,
        signal: controller.signal,
      }
      let pending
      try {
        if (!call.binding.fn) throw new UnknownCapability(call.binding.id)
        pending = Promise.resolve(call.binding.fn(call.input, context))
      } catch (error) {
        pending = Promise.reject(error)
      }
      pending.then(
        (output) => this.#settle(call, outcomeOf(call, output)),
        (error) => this.#settle(call, failureOf(call, error)),
      )
    }
  }

  #settle(call, outcome) {
    if (this.#finished) return
    this.#running.delete(call.callId)
    this.#complete({ callId: call.callId, outcome })
    this.#pump()
  }

  #complete(completion) {
    this.#ready.push(completion)
    this.deliver?.()
  }

  #done(result) {
    if (result.tag === 'err') {
      const { name, message, stack, line, column } = result.val
      const rejection = this.#rejections.find(([n, m]) => n === name && m === message)
      const error = { kind: rejection ? scriptErrorKind(name) : 'script_error', message, name }
      if (stack !== undefined) error.stack = stack
      if (line !== undefined) error.line = line
      if (column !== undefined) error.column = column
      if (rejection) error.tool_call_id = rejection[2]
      return { error }
    }
    if (result.val === undefined) return {}
    const bytes = utf8Length(result.val)
    if (bytes > this.#limits.max_result_bytes) {
      return {
        error: {
          kind: 'result_too_large',
          message: `the result is ${bytes} bytes of JSON, over the ${this.#limits.max_result_bytes} byte limit`,
          limit: 'result_size',
          calls_started: this.#calls,
        },
      }
    }
    try {
      return { value: parseGuestJson(result.val) }
    } catch (error) {
      return { error: { kind: 'internal_error', message: `the guest trapped: the guest returned invalid JSON: ${error.message}` } }
    }
  }

  #report({ value, error }) {
    const report = { ok: error === undefined }
    if (error !== undefined) report.error = error
    else if (value !== undefined) report.value = value
    report.logs = this.#logs
    report.stats = {
      fuel: 0,
      wall_us: Math.round((performance.now() - this.#started) * 1000),
      peak_memory_bytes: this.#memoryBytes,
      calls: this.#calls,
    }
    return report
  }
}

class UnknownCapability extends Error {
  constructor(id) {
    super(`unknown capability ${id}`)
    this.name = 'UnknownCapability'
  }
}

function tryParse(text) {
  try {
    return parseGuestJson(text)
  } catch {
    return undefined
  }
}

/** A tool's value as the guest receives it: text for text-output capabilities, else JSON. */
function outcomeOf(call, output) {
  if (call.binding.textOutput) {
    const text = typeof output === 'string' ? output : JSON.stringify(output ?? null)
    return { tag: 'ok', val: { tag: 'text', val: text } }
  }
  let text
  try {
    text = JSON.stringify(output === undefined ? null : output)
  } catch (error) {
    return failureOf(call, new Error(`its result is not JSON: ${error.message}`))
  }
  return { tag: 'ok', val: { tag: 'json', val: text } }
}

/** A tool's failure as the guest receives it, worded like the Rust host's InvokeCapabilityError. */
function failureOf(call, error) {
  const id = call.binding.id
  const text = error instanceof Error ? error.message : String(error)
  let name = 'CapabilityError'
  let message = `${id} failed: ${text}`
  if (error instanceof UnknownCapability) message = text
  else if (error && error.name === 'PermissionDenied') {
    name = 'PermissionDenied'
    message = `permission denied for ${id}: ${text}`
  }
  return { tag: 'err', val: { name, message, toolCallId: call.toolCallId } }
}
