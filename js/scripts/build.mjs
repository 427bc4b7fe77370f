#!/usr/bin/env node
// `npm run build`: transpiles the prebuilt guest component (guest/dist/corral-guest.wasm) with the
// pinned jco into gen/, in sync instantiation mode: the generated `instantiate` takes the compiled
// core modules and the imports from the host (src/worker.js), so nothing is loaded implicitly and
// no preview2-shim is involved. The component imports only `corral:sandbox/host`; this script
// refuses a component that imports anything else, since a JS host would have to invent it.
import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync, rmSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const component = path.resolve(root, '../guest/dist/corral-guest.wasm')
const out = path.join(root, 'gen')
const jco = path.join(root, 'node_modules/.bin/jco')

if (!existsSync(jco)) {
  console.error('js/scripts/build.mjs: jco is not installed; run `npm ci` in js/ first')
  process.exit(1)
}
rmSync(out, { recursive: true, force: true })
execFileSync(
  jco,
  ['transpile', component, '-o', out, '--name', 'corral-guest', '--instantiation', 'sync', '--no-wasi-shim', '--quiet'],
  { stdio: ['ignore', 'ignore', 'inherit'] },
)

// The core modules' imports are what the component really needs from a host.
const allowed = new Set(['corral:sandbox/host@0.4.0', ''])
for (const file of ['corral-guest.core.wasm', 'corral-guest.core2.wasm', 'corral-guest.core3.wasm']) {
  const module = new WebAssembly.Module(readFileSync(path.join(out, file)))
  for (const entry of WebAssembly.Module.imports(module)) {
    if (!allowed.has(entry.module)) {
      console.error(`js/scripts/build.mjs: ${file} imports ${entry.module}#${entry.name}; only corral:sandbox/host is provided`)
      process.exit(1)
    }
  }
}
