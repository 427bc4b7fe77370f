// The corpus under both hosts, compared directly: each script through `corral exec` (wasmtime)
// and through the JS host must give the same ok, error kind, value, error name and position, and
// the same log lines. Runs when CORRAL_BIN names a built `corral` binary (scripts/test can pass
// target/release/corral); skipped otherwise.
//
// Left out, with reasons: scripts that expect `fuel_exhausted` (a JS engine has no fuel; see
// corpus.test.mjs for their deadline stand-in) and scripts whose `// limits:` need a limit
// `corral exec` has no flag for (they are compared with their expectations in corpus.test.mjs).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'

import { createSandbox, exampleCatalog, exampleTools } from '../src/index.js'

const corral = process.env.CORRAL_BIN
const dir = new URL('../../tests/corpus/scripts/', import.meta.url)
const FLAGS = { timeout_ms: '--timeout-ms', max_total_calls: '--max-total-calls', max_concurrent_calls: '--max-concurrent-calls' }

function header(source) {
  const out = {}
  for (const line of source.split('\n')) {
    if (!line.startsWith('// ')) break
    const at = line.indexOf(': ')
    if (at > 0 && ['expect', 'limits', 'user'].includes(line.slice(3, at))) out[line.slice(3, at)] = JSON.parse(line.slice(at + 2))
  }
  return out
}

const outcome = (r) => ({
  ok: r.ok,
  kind: r.error?.kind,
  value: r.value,
  name: r.error?.name,
  line: r.error?.line,
  column: r.error?.column,
  calls_started: r.error?.calls_started,
  logs: r.logs.map((l) => [l.level, l.message, l.fields]),
})

const sandbox = createSandbox()
test.after(() => sandbox.close())

for (const file of readdirSync(dir).filter((n) => n.endsWith('.js')).sort()) {
  const source = readFileSync(new URL(file, dir), 'utf8')
  const h = header(source)
  const limits = { ...h.limits }
  const args = ['exec', new URL(file, dir).pathname]
  let skip = corral ? false : 'CORRAL_BIN is not set'
  if (h.expect?.error?.kind === 'fuel_exhausted') skip = 'needs fuel'
  for (const [key, value] of Object.entries(limits)) {
    if (key === 'memory_bytes' && value % (1 << 20) === 0) args.push('--memory-mb', String(value >> 20))
    else if (key === 'fuel') args.push('--fuel', String(value))
    else if (FLAGS[key]) args.push(FLAGS[key], String(value))
    else skip ||= `corral exec has no flag for ${key}`
  }
  if (h.user) args.push('--user', JSON.stringify(h.user))
  delete limits.fuel
  test(`${file.replace(/\.js$/, '')} (wasmtime vs JS)`, { skip }, async () => {
    let text
    try {
      text = execFileSync(corral, args, { encoding: 'utf8', maxBuffer: 1 << 26 })
    } catch (error) {
      text = error.stdout // exit status 1 when the script failed
    }
    const rust = JSON.parse(text)
    const session = await sandbox.session({ id: 'exec', tools: exampleTools, catalog: exampleCatalog, user: h.user, limits })
    const js = await session.run(source)
    session.close()
    assert.deepEqual(outcome(js), outcome(rust))
  })
}
