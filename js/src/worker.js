// The guest's thread: one worker holds one session's guest instance and drives its exports when
// the main thread (src/index.js) asks. Tools never run here: `host.start-call` posts the call to
// the main thread and returns at once, so the script keeps computing while its calls run. The
// main thread terminates this worker when a script's deadline passes, which stops guest code
// wherever it is (V8 interrupts WebAssembly loops too).
//
// Limits that must stop the script at the moment they are hit are checked here, inside the
// imports: a JS exception thrown from an import unwinds the guest like a trap (the guest cannot
// catch it), so the instance is dropped and the main thread reports the limit.
//
// Messages from the main thread: {type: 'instantiate', modules, config, limits},
// {type: 'run', source, scriptId}, {type: 'resume', completions}, {type: 'drop'} (the session
// was closed; the worker is kept for another session's fresh instance), {type: 'prepare',
// modules, capBytes} (instantiate a fresh guest now, for the next session with that cap).
// Messages to it: {type: 'call', callId, binding, argsJson}, {type: 'log', level, message,
// fieldsJson}, {type: 'ready'} | {type: 'init-failed', message}, {type: 'state', state, result?,
// memoryBytes}, {type: 'trap', limit?, kind, message, memoryBytes}.
import { parentPort } from 'node:worker_threads'
import { instantiate } from '../gen/corral-guest.js'

/** A limit hit inside an import; thrown through the guest so that it cannot be caught there. */
class LimitTrap extends Error {
  constructor(limit, message) {
    super(message)
    this.limit = limit
  }
}

/** The session's guest, or null before `instantiate` and after a trap. */
let guest = null
/** A fresh, not yet initialized instance made while the worker was idle ({capBytes, session, memory}). */
let prepared = null
/** The session's linear memory (to measure and cap it). */
let memory = null
let limits = null
let clock = null
let callsStarted = 0
let logBytes = 0
let peakMemory = 0

const utf8Length = (text) => Buffer.byteLength(text, 'utf8')

function memoryBytes() {
  const bytes = memory ? memory.buffer.byteLength : 0
  if (bytes > peakMemory) peakMemory = bytes
  return bytes
}

/** The guest's memory may grow past the cap (see README: the declared maximum leaves headroom
 * above it); it must never be used past it. Checked in every import and after every export. */
function checkMemory() {
  const bytes = memoryBytes()
  if (bytes > limits.memory_bytes) {
    throw new LimitTrap(
      'memory',
      `linear memory grew to ${bytes} bytes, over the ${limits.memory_bytes} byte cap`,
    )
  }
}

const host = {
  startCall(callId, binding, argsJson) {
    checkMemory()
    if (callsStarted >= limits.max_total_calls) {
      throw new LimitTrap(
        'total_calls',
        `the script tried to start call ${callsStarted + 1} of at most ${limits.max_total_calls}`,
      )
    }
    callsStarted += 1
    parentPort.postMessage({ type: 'call', callId, binding, argsJson })
    // The outcome comes later, in a batch: tools run on the main thread, never inside this
    // import (none: nothing is answered at start).
    return undefined
  },
  nowMs() {
    checkMemory()
    return clock.tag === 'host' ? BigInt(Date.now()) : clock.val
  },
  log(level, message, fieldsJson) {
    checkMemory()
    logBytes += utf8Length(message) + (fieldsJson === undefined ? 0 : utf8Length(fieldsJson))
    if (logBytes > limits.max_log_bytes) {
      throw new LimitTrap(
        'log_size',
        `logs reached ${logBytes} bytes, over the ${limits.max_log_bytes} byte limit`,
      )
    }
    parentPort.postMessage({ type: 'log', level, message, fieldsJson })
  },
}

function instantiateGuest(modules) {
  memory = null
  const instantiateCore = (module, imports) => {
    const instance = new WebAssembly.Instance(module, imports)
    if (instance.exports.memory instanceof WebAssembly.Memory) memory = instance.exports.memory
    return instance
  }
  // jco 1.35's generated code reads the unversioned key although its types name the versioned
  // one; both are given so that a jco that fixes this keeps working.
  const imports = { 'corral:sandbox/host': host, 'corral:sandbox/host@0.4.0': host }
  const root = instantiate((path) => modules[path], imports, instantiateCore)
  return root['corral:sandbox/session@0.4.0']
}

/** Runs one export of the guest and reports where the script stands (or why it stopped). */
function drive(call) {
  let state
  try {
    state = call()
    checkMemory()
  } catch (error) {
    guest = null
    parentPort.postMessage({ type: 'trap', ...classifyTrap(error), memoryBytes: peakMemory })
    return
  }
  parentPort.postMessage({
    type: 'state',
    state: state.tag,
    result: state.tag === 'done' ? state.val : undefined,
    memoryBytes: peakMemory,
  })
}

/** What stopped the guest: a limit, or a trap that is the guest's (or the host's) fault. */
function classifyTrap(error) {
  if (error instanceof LimitTrap) return { limit: error.limit, message: error.message }
  if (memory && memory.buffer.byteLength > limits.memory_bytes) {
    // The guest ran out of its declared maximum (cap plus headroom) before calling out.
    return {
      limit: 'memory',
      message: `linear memory grew to ${memory.buffer.byteLength} bytes, over the ${limits.memory_bytes} byte cap`,
    }
  }
  if (error instanceof RangeError && /call stack/i.test(error.message)) {
    return { limit: 'stack', message: 'the script exhausted the stack (too deep recursion)' }
  }
  if (error instanceof WebAssembly.RuntimeError) {
    return { kind: 'internal_error', message: `the guest trapped: ${error.message}` }
  }
  return { kind: 'internal_error', message: `the host failed: ${error && error.stack ? error.stack : error}` }
}

parentPort.on('message', (message) => {
  switch (message.type) {
    case 'prepare':
      // Instantiating costs milliseconds in V8; an idle worker does it ahead of the next session.
      try {
        const session = instantiateGuest(message.modules)
        prepared = { capBytes: message.capBytes, session, memory }
      } catch {
        prepared = null
      }
      memory = null
      break
    case 'instantiate': {
      limits = message.limits
      clock = message.config.clock
      peakMemory = 0
      try {
        if (prepared !== null && prepared.capBytes === limits.memory_bytes) {
          guest = prepared.session
          memory = prepared.memory
        } else {
          guest = instantiateGuest(message.modules)
        }
        prepared = null
        memoryBytes()
        // `init` throws jco's ComponentError carrying the guest's message when it refuses.
        guest.init(message.config)
        parentPort.postMessage({ type: 'ready' })
      } catch (error) {
        guest = null
        const detail = error && error.payload !== undefined ? error.payload : error && error.message
        parentPort.postMessage({ type: 'init-failed', message: String(detail) })
      }
      break
    }
    case 'run':
      callsStarted = 0
      logBytes = 0
      peakMemory = 0
      memoryBytes()
      if (guest === null) {
        parentPort.postMessage({ type: 'trap', kind: 'internal_error', message: 'the host failed: no guest instance', memoryBytes: 0 })
        break
      }
      drive(() => guest.run(message.source))
      break
    case 'resume':
      if (guest === null) {
        parentPort.postMessage({ type: 'trap', kind: 'internal_error', message: 'the host failed: no guest instance', memoryBytes: 0 })
        break
      }
      drive(() => guest.resume(message.completions))
      break
    case 'drop':
      // The session was closed; the worker waits for the next one.
      guest = null
      memory = null
      break
    default:
      break
  }
})
