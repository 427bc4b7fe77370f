// The script corpus of tests/corpus under the JS host: every script must give the outcome it
// gives under wasmtime (tests/slow/corpus.rs), in a fresh session on the example catalog, and a
// new session must still work after it.
//
// Fuel does not exist in a JS engine. The scripts that expect `fuel_exhausted` are run with a
// 300 ms deadline instead and must end with `deadline_exceeded` (same calls_started and other
// details): the JS host stops the same runaway work, by wall clock. Nothing else is skipped.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'

import { createSandbox, exampleCatalog, exampleTools } from '../src/index.js'

const dir = new URL('../../tests/corpus/scripts/', import.meta.url)
const files = readdirSync(dir).filter((name) => name.endsWith('.js')).sort()
const FUEL_STANDIN_TIMEOUT_MS = 300

/** The `// key: json` header lines, as tests/slow/corpus.rs reads them. */
function parseHeader(source) {
  const header = {}
  for (const line of source.split('\n')) {
    if (!line.startsWith('// ')) break
    const at = line.indexOf(': ')
    if (at < 0) continue
    const key = line.slice(3, at)
    if (key === 'expect' || key === 'limits' || key === 'user') header[key] = JSON.parse(line.slice(at + 2))
  }
  return header
}

/** tests/support's json_contains: `expected` is a subset of `actual`, with `$absent` and `$contains`. */
export function jsonContains(actual, expected, path = '') {
  if (typeof expected === 'object' && expected !== null && !Array.isArray(expected)) {
    if (expected.$absent === true) {
      if (actual !== undefined) throw new Error(`${path}: expected no value, found ${JSON.stringify(actual)}`)
      return
    }
    if (typeof expected.$contains === 'string') {
      if (typeof actual !== 'string' || !actual.includes(expected.$contains)) {
        throw new Error(`${path}: expected a string containing ${JSON.stringify(expected.$contains)}, found ${JSON.stringify(actual)}`)
      }
      return
    }
  }
  if (actual === undefined) throw new Error(`${path}: expected ${JSON.stringify(expected)}, found nothing`)
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      throw new Error(`${path}: expected ${expected.length} elements, found ${JSON.stringify(actual)}`)
    }
    expected.forEach((want, i) => jsonContains(actual[i], want, `${path}[${i}]`))
  } else if (typeof expected === 'object' && expected !== null) {
    if (typeof actual !== 'object' || actual === null || Array.isArray(actual)) {
      throw new Error(`${path}: expected ${JSON.stringify(expected)}, found ${JSON.stringify(actual)}`)
    }
    for (const [key, want] of Object.entries(expected)) jsonContains(actual[key], want, `${path}.${key}`)
  } else if (expected !== actual) {
    throw new Error(`${path}: expected ${JSON.stringify(expected)}, found ${JSON.stringify(actual)}`)
  }
}

/** A fuel expectation turned into the deadline one the JS host must meet instead. */
function withoutFuel(header) {
  const expect = structuredClone(header.expect)
  if (expect.error?.kind !== 'fuel_exhausted') return header
  expect.error.kind = 'deadline_exceeded'
  if ('limit' in expect.error) expect.error.limit = 'deadline'
  if (expect.stats) delete expect.stats.fuel
  const limits = { ...header.limits, timeout_ms: FUEL_STANDIN_TIMEOUT_MS }
  delete limits.fuel
  return { ...header, expect, limits }
}

const sandbox = createSandbox()
test.after(() => sandbox.close())

test('the corpus is all there', () => {
  assert.ok(files.length >= 40, `only ${files.length} scripts found`)
})

for (const file of files) {
  test(file.replace(/\.js$/, ''), { concurrency: true }, async () => {
    const source = readFileSync(new URL(file, dir), 'utf8')
    const header = withoutFuel(parseHeader(source))
    assert.ok(header.expect, 'the script has no `// expect: {...}` header')
    const limits = { ...header.limits }
    delete limits.fuel
    const session = await sandbox.session({
      id: 'corpus',
      tools: exampleTools,
      catalog: exampleCatalog,
      user: header.user,
      limits,
    })
    const report = await session.run(source)
    session.close()
    try {
      jsonContains(report, header.expect)
    } catch (error) {
      throw new Error(`${error.message}\nfull report: ${JSON.stringify(report)}`)
    }
    const next = await sandbox.session({ tools: exampleTools, catalog: exampleCatalog })
    const after = await next.run('return 41 + 1')
    next.close()
    assert.equal(after.value, 42, `the next session is broken: ${JSON.stringify(after)}`)
  })
}
