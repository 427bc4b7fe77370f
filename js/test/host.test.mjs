// What an embedder relies on beyond the corpus: calls really concurrent, the deadline, fresh
// instances after a trap, deny-all, validation before tools, and the component's imports.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'

import { createSandbox, exampleCatalog, exampleTools, GUEST_MAX_MEMORY_BYTES } from '../src/index.js'

const sandbox = createSandbox()
test.after(() => sandbox.close())

test('calls of a Promise.all are in flight at once', async () => {
  const spans = []
  const slow = async ({ n }) => {
    const start = performance.now()
    await sleep(200)
    spans.push({ n, start, end: performance.now() })
    return n
  }
  const session = await sandbox.session({ tools: { slow } })
  const report = await session.run('return await Promise.all([1, 2, 3, 4].map((n) => tools.slow({ n })))')
  session.close()
  assert.deepEqual(report.value, [1, 2, 3, 4])
  assert.equal(spans.length, 4)
  const lastStart = Math.max(...spans.map((s) => s.start))
  const firstEnd = Math.min(...spans.map((s) => s.end))
  // Timestamps, not a wall-clock bound (the machine may be loaded): all four were running at once.
  assert.ok(lastStart < firstEnd, `every call started before the first finished: ${JSON.stringify(spans)}`)
})

test('max_concurrent_calls bounds the calls in flight', async () => {
  let inFlight = 0
  let peak = 0
  const slow = async () => {
    peak = Math.max(peak, ++inFlight)
    await sleep(20)
    inFlight -= 1
    return null
  }
  const session = await sandbox.session({ tools: { slow }, limits: { max_concurrent_calls: 2 } })
  const report = await session.run('await Promise.all(Array.from({ length: 6 }, () => tools.slow({}))); return 1')
  session.close()
  assert.equal(report.value, 1)
  assert.equal(peak, 2)
})

test('the deadline stops while(true){} and the session runs on with a fresh instance', async () => {
  const session = await sandbox.session({ limits: { timeout_ms: 200 } })
  const report = await session.run('while (true) {}')
  assert.equal(report.ok, false)
  assert.equal(report.error.kind, 'deadline_exceeded')
  assert.equal(report.error.limit, 'deadline')
  assert.equal(report.error.calls_started, 0)
  const after = await session.run('return 6 * 7')
  session.close()
  assert.equal(after.value, 42)
})

test('the deadline also covers waiting on a tool that never answers', async () => {
  const session = await sandbox.session({ tools: { hang: () => new Promise(() => {}) }, limits: { timeout_ms: 100 } })
  const report = await session.run('await tools.hang({})')
  session.close()
  assert.equal(report.error.kind, 'deadline_exceeded')
  assert.equal(report.error.calls_started, 1)
  assert.match(report.error.message, /waited on capability calls/)
})

test('a trap discards the instance: the next run gets a fresh one', async () => {
  const session = await sandbox.session()
  assert.equal((await session.run('globalThis.kept = 7; return 1')).value, 1)
  // Without a trap, globalThis carries over: the same instance.
  assert.equal((await session.run('return globalThis.kept')).value, 7)
  const trapped = await session.run('function down(n) { return down(n + 1) + 1 } return down(0)')
  assert.equal(trapped.error.kind, 'stack_overflow')
  // A fresh instance: the earlier global is gone, and scripts run again.
  const fresh = await session.run('return [typeof globalThis.kept, 40 + 2]')
  session.close()
  assert.deepEqual(fresh.value, ['undefined', 42])
})

test('a memory limit discards the instance too', async () => {
  const session = await sandbox.session({ limits: { memory_bytes: 32 << 20 } })
  await session.run('globalThis.kept = 1')
  const report = await session.run('const h = []; while (true) h.push("x".repeat(1 << 16) + h.length)')
  assert.equal(report.error.kind, 'memory_limit')
  const fresh = await session.run('return typeof globalThis.kept')
  session.close()
  assert.equal(fresh.value, 'undefined')
})

test('deny-all: only the tools given are bound', async () => {
  const none = await sandbox.session()
  const empty = await none.run('return [Object.keys(tools), typeof tools.examples]')
  assert.deepEqual(empty.value, [[], 'undefined'])
  const call = await none.run('return await tools.examples.echo({})')
  none.close()
  assert.equal(call.error.kind, 'script_error')
  assert.equal(call.error.name, 'TypeError')

  const echoOnly = await sandbox.session({ tools: { 'examples.echo': exampleTools['examples.echo'] } })
  const keys = await echoOnly.run('return Object.keys(tools).sort()')
  echoOnly.close()
  assert.deepEqual(keys.value, ['examples', 'examples.echo'])
})

test('a catalog capability without a tool fails as an unknown capability', async () => {
  const session = await sandbox.session({ catalog: exampleCatalog, tools: { 'examples.echo': exampleTools['examples.echo'] } })
  const report = await session.run('await tools.examples.sleep({ ms: 1 })')
  session.close()
  assert.equal(report.error.kind, 'capability_error')
  assert.equal(report.error.message, 'unknown capability examples.sleep')
})

test('invalid input is rejected before the tool runs', async () => {
  let called = 0
  const tools = { ...exampleTools, 'examples.sleep': async () => ++called }
  const session = await sandbox.session({ catalog: exampleCatalog, tools })
  const report = await session.run('await tools.examples.sleep({ ms: -1 })')
  session.close()
  assert.equal(called, 0)
  assert.equal(report.error.kind, 'invalid_input')
  assert.equal(report.error.name, 'ValidationError')
  assert.equal(report.error.message, 'input for examples.sleep is invalid: /ms: -1 is less than the minimum of 0')
})

test('error kinds follow what the host delivered, not the names a script chooses', async () => {
  const session = await sandbox.session({ tools: { 'shop.fail': async () => { throw new Error('out of stock') } } })
  const forged = await session.run("throw Object.assign(new Error('no call was made'), {name: 'CapabilityError'})")
  assert.equal(forged.error.kind, 'script_error')
  assert.equal(forged.error.name, 'CapabilityError')
  const real = await session.run('await tools.shop.fail({})')
  session.close()
  assert.equal(real.error.kind, 'capability_error')
  assert.equal(real.error.message, 'shop.fail failed: out of stock')
  assert.match(real.error.tool_call_id, /:0$/)
})

test('calls a script leaves behind are aborted when it returns', async () => {
  let aborted
  const wait = (_input, { signal }) => new Promise((resolve) => signal.addEventListener('abort', () => resolve((aborted = true))))
  const session = await sandbox.session({ tools: { wait } })
  const report = await session.run('tools.wait({}); return "done"')
  session.close()
  assert.equal(report.value, 'done')
  await sleep(10)
  assert.equal(aborted, true)
})

test('a closed session gives its worker back, and the next session gets a fresh guest', async () => {
  const first = await sandbox.session()
  await first.run('globalThis.leak = "secret"')
  first.close()
  const second = await sandbox.session()
  const report = await second.run('return typeof globalThis.leak')
  second.close()
  assert.equal(report.value, 'undefined')
})

test('binding collisions fail when the session is created', async () => {
  const catalog = { capabilities: [{ id: 'a', input_schema: {} }, { id: 'b', js_path: ['a'], input_schema: {} }] }
  await assert.rejects(sandbox.session({ catalog }), /binding the capabilities failed/)
})

test('the real clock is granted only when asked for', async () => {
  const frozen = await sandbox.session()
  const real = await sandbox.session({ clock: 'real' })
  const [a, b] = await Promise.all([frozen.run('return Date.now()'), real.run('return Date.now()')])
  frozen.close()
  real.close()
  assert.equal(a.value, 0)
  assert.ok(Math.abs(b.value - Date.now()) < 5000)
})

test('the component imports corral:sandbox/host and nothing else', () => {
  const wit = execFileSync(new URL('../node_modules/.bin/jco', import.meta.url).pathname, [
    'wit',
    new URL('../../guest/dist/corral-guest.wasm', import.meta.url).pathname,
  ]).toString()
  const imports = [...wit.matchAll(/^\s*import\s+([^;]+);/gm)].map((m) => m[1]).sort()
  // `types` holds only type definitions (no functions), shared by host and session.
  assert.deepEqual(imports, ['corral:sandbox/host@0.4.0', 'corral:sandbox/types@0.4.0'])
  for (const name of ['corral-guest.core.wasm', 'corral-guest.core2.wasm', 'corral-guest.core3.wasm']) {
    const module = new WebAssembly.Module(readFileSync(new URL(`../gen/${name}`, import.meta.url)))
    for (const entry of WebAssembly.Module.imports(module)) {
      // '' is jco's own shim between the core modules.
      assert.ok(['corral:sandbox/host@0.4.0', ''].includes(entry.module), `${name} imports ${entry.module}#${entry.name}`)
    }
  }
})

test('the guest memory declares a 1 GiB maximum', () => {
  const bytes = readFileSync(new URL('../gen/corral-guest.core.wasm', import.meta.url))
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
  let maximum
  while (p < bytes.length) {
    const id = bytes[p++]
    const size = leb()
    const end = p + size
    if (id === 5) {
      leb()
      const flags = bytes[p++]
      leb()
      maximum = flags & 1 ? leb() * 65536 : undefined
    }
    p = end
  }
  assert.equal(maximum, GUEST_MAX_MEMORY_BYTES)
})

test('the README shows examples/hello.mjs as it is', () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8')
  const block = readme.match(/```js\n([\s\S]*?)```/)
  assert.ok(block, 'README.md has no js example')
  assert.equal(block[1], readFileSync(new URL('../examples/hello.mjs', import.meta.url), 'utf8'))
})

test('the README example runs', () => {
  const out = execFileSync(process.execPath, [new URL('../examples/hello.mjs', import.meta.url).pathname]).toString()
  assert.equal(out.trim(), '["Oslo: 21°C","Lima: 21°C"]')
})

test('the types compile under tsc --strict', () => {
  const tsc = new URL('../node_modules/.bin/tsc', import.meta.url).pathname
  execFileSync(tsc, ['-p', new URL('./types/tsconfig.json', import.meta.url).pathname], { stdio: 'pipe' })
})
