#!/usr/bin/env node
// Figures of the JS host beside quickjs-emscripten, in the same run:
//
//   node bench.mjs [--quick]
//
// prints one JSON document: {node, date, machine, peers, results: [{peer, workload, unit, n,
// p50, p99, min, max, mean, note}]}. Workloads:
//   new_session     new session + `return 1+1` + close, per session (us), back to back: the
//                   guest's instantiation (milliseconds in V8) is on the measured path
//   new_session_prepared  the same with unmeasured idle time between sessions, in which the
//                   sandbox's idle workers instantiate the next guests ahead of time
//   call_roundtrip  one awaited async host call inside a script, per call (us): each sample is
//                   a run of CALLS sequential `await tools.host({})`, divided by CALLS
//   fib27           `fib(27)` in a fresh session (ms): the same guest as corral's Rust host, its
//                   code compiled by V8 instead of Cranelift (and no fuel: V8 has none)
// Each (peer, workload) runs in its own child process, as bench/peers/run.mjs does, so one
// peer's garbage and JIT state cannot touch another's figures. quickjs-emscripten comes from
// bench/peers/node_modules (install it with bench/peers/install.sh; PEERS_SKIP_IVM=1 is enough).
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'

import { createSandbox } from './src/index.js'

const quick = process.argv.includes('--quick')
const CALLS = 200
const COUNTS = quick
  ? { sessions: 100, preparedSessions: 50, warmSessions: 30, qjsSessions: 500, runs: 10 }
  : { sessions: 1000, preparedSessions: 300, warmSessions: 100, qjsSessions: 2000, runs: 50 }
const PREPARE_PAUSE_MS = 20
const FIB = 'function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2) } return fib(27)'
const FIB_RUNS = quick ? 5 : 15
const now = () => process.hrtime.bigint()
const us = (ns) => Number(ns) / 1e3

function stats(samples) {
  const s = [...samples].sort((a, b) => a - b)
  const pct = (p) => s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]
  const r = (x) => Math.round(x * 10) / 10
  return { n: s.length, p50: r(pct(50)), p99: r(pct(99)), min: r(s[0]), max: r(s[s.length - 1]), mean: r(s.reduce((a, b) => a + b, 0) / s.length) }
}

const peers = {
  'corral-js': {
    version: () => {
      const read = (path) => JSON.parse(readFileSync(new URL(path, import.meta.url), 'utf8')).version
      return `@corral/sandbox@${read('./package.json')} (jco ${read('./node_modules/@bytecodealliance/jco/package.json')})`
    },
    async new_session() {
      const sandbox = createSandbox()
      const one = async () => {
        const session = await sandbox.session()
        const report = await session.run('return 1+1')
        session.close()
        if (report.value !== 2) throw new Error(`1+1 gave ${JSON.stringify(report)}`)
      }
      for (let i = 0; i < COUNTS.warmSessions; i++) await one()
      const samples = []
      for (let i = 0; i < COUNTS.sessions; i++) {
        const t0 = now()
        await one()
        samples.push(us(now() - t0))
      }
      sandbox.close()
      return {
        samples,
        note: 'sandbox.session() (a fresh guest instance + init in an idle worker) + run("return 1+1") + close(); guest compiled once per sandbox',
      }
    },
    async new_session_prepared() {
      const sandbox = createSandbox()
      const one = async () => {
        const session = await sandbox.session()
        const report = await session.run('return 1+1')
        session.close()
        if (report.value !== 2) throw new Error(`1+1 gave ${JSON.stringify(report)}`)
      }
      for (let i = 0; i < COUNTS.warmSessions; i++) await one()
      const samples = []
      for (let i = 0; i < COUNTS.preparedSessions; i++) {
        // Idle time (not measured) in which the idle workers instantiate the next guests.
        await new Promise((resolve) => setTimeout(resolve, PREPARE_PAUSE_MS))
        const t0 = now()
        await one()
        samples.push(us(now() - t0))
      }
      sandbox.close()
      return {
        samples,
        note: `as new_session, with ${PREPARE_PAUSE_MS} ms of unmeasured idle time before each session, in which an idle worker has instantiated the next guest: init + run + close only`,
      }
    },
    async call_roundtrip() {
      const sandbox = createSandbox()
      const session = await sandbox.session({ tools: { host: async () => null } })
      const src = `for (let i = 0; i < ${CALLS}; i++) await tools.host({}); return ${CALLS}`
      for (let i = 0; i < 3; i++) await session.run(src)
      const samples = []
      for (let r = 0; r < COUNTS.runs; r++) {
        const t0 = now()
        const report = await session.run(src)
        samples.push(us(now() - t0) / CALLS)
        if (report.value !== CALLS) throw new Error(JSON.stringify(report))
      }
      session.close()
      sandbox.close()
      return {
        samples,
        note: `${CALLS} sequential awaited calls per run; tool = async () => null on the main thread, the guest in its worker (start-call posted, completion delivered by resume)`,
      }
    },
    async fib27() {
      const sandbox = createSandbox()
      const samples = []
      for (let i = 0; i < FIB_RUNS + 2; i++) {
        const session = await sandbox.session({ limits: { timeout_ms: 60_000 } })
        const t0 = now()
        const report = await session.run(FIB)
        const ms = us(now() - t0) / 1e3
        session.close()
        if (report.value !== 196418) throw new Error(`fib(27) gave ${JSON.stringify(report)}`)
        if (i >= 2) samples.push(ms)
      }
      sandbox.close()
      return { samples, unit: 'ms', note: 'run(fib(27)) in a fresh session; a deadline, no fuel' }
    },
  },
  'quickjs-emscripten-shared': {
    Q: null,
    async load() {
      const require = createRequire(new URL('../bench/peers/package.json', import.meta.url))
      this.Q = require('quickjs-emscripten')
      this.v = require('quickjs-emscripten/package.json').version
      return this.Q.getQuickJS()
    },
    version() {
      return `quickjs-emscripten@${this.v}`
    },
    async new_session() {
      const mod = await this.load()
      const one = () => {
        const rt = mod.newRuntime()
        const ctx = rt.newContext()
        const r = ctx.evalCode('(function(){return 1+1})()')
        const v = ctx.getNumber(ctx.unwrapResult(r))
        ctx.dispose()
        rt.dispose()
        if (v !== 2) throw new Error(`1+1 gave ${v}`)
      }
      for (let i = 0; i < 300; i++) one()
      const samples = []
      for (let i = 0; i < COUNTS.qjsSessions; i++) {
        const t0 = now()
        one()
        samples.push(us(now() - t0))
      }
      return { samples, note: 'getQuickJS() once; newRuntime() + newContext() + evalCode + dispose per session (same thread, no deadline)' }
    },
    async call_roundtrip() {
      const mod = await this.load()
      const rt = mod.newRuntime()
      const ctx = rt.newContext()
      const fn = ctx.newFunction('host', () => {
        const deferred = ctx.newPromise()
        deferred.settled.then(() => rt.executePendingJobs())
        Promise.resolve().then(() => deferred.resolve())
        return deferred.handle
      })
      ctx.setProp(ctx.global, 'host', fn)
      fn.dispose()
      const run = async () => {
        const handle = ctx.unwrapResult(ctx.evalCode(`(async () => { for (let i = 0; i < ${CALLS}; i++) await host(); return ${CALLS} })()`))
        const settled = ctx.resolvePromise(handle)
        handle.dispose()
        rt.executePendingJobs()
        const value = ctx.unwrapResult(await settled)
        const v = ctx.getNumber(value)
        value.dispose()
        if (v !== CALLS) throw new Error(`returned ${v}`)
      }
      for (let i = 0; i < 3; i++) await run()
      const samples = []
      for (let r = 0; r < COUNTS.runs; r++) {
        const t0 = now()
        await run()
        samples.push(us(now() - t0) / CALLS)
      }
      ctx.dispose()
      rt.dispose()
      return { samples, note: `${CALLS} sequential awaited calls per run; host() = vm.newPromise() resolved in a host microtask, executePendingJobs on settle` }
    },
    async fib27() {
      const mod = await this.load()
      const samples = []
      for (let i = 0; i < FIB_RUNS + 2; i++) {
        const rt = mod.newRuntime()
        const ctx = rt.newContext()
        const t0 = now()
        const v = ctx.getNumber(ctx.unwrapResult(ctx.evalCode(`(function(){ ${FIB} })()`)))
        const ms = us(now() - t0) / 1e3
        ctx.dispose()
        rt.dispose()
        if (v !== 196418) throw new Error(`fib(27) gave ${v}`)
        if (i >= 2) samples.push(ms)
      }
      return { samples, unit: 'ms', note: 'evalCode(fib(27)) in a fresh runtime and context; no deadline' }
    },
  },
}

const childAt = process.argv.indexOf('--child')
if (childAt >= 0) {
  const [peer, workload] = process.argv.slice(childAt + 1, childAt + 3)
  const adapter = peers[peer]
  const { samples, note, unit = 'us' } = await adapter[workload]()
  process.stdout.write(JSON.stringify({ peer, workload, unit, ...stats(samples), note, version: adapter.version() }))
  process.exit(0)
}

const results = []
const versions = {}
for (const workload of ['new_session', 'new_session_prepared', 'call_roundtrip', 'fib27']) {
  for (const peer of Object.keys(peers)) {
    if (!peers[peer][workload]) continue
    process.stderr.write(`bench: ${peer} ${workload}\n`)
    const args = [new URL(import.meta.url).pathname, '--child', peer, workload, ...(quick ? ['--quick'] : [])]
    const child = spawnSync(process.execPath, args, { encoding: 'utf8', maxBuffer: 1 << 24 })
    if (child.status !== 0) {
      results.push({ peer, workload, unit: 'us', n: 0, note: `failed: ${child.stderr.trim().split('\n').slice(-3).join(' | ')}` })
      continue
    }
    const { version, ...result } = JSON.parse(child.stdout)
    versions[peer] = version
    results.push(result)
  }
}
console.log(JSON.stringify({
  node: process.version,
  date: new Date().toISOString(),
  mode: quick ? 'quick' : 'full',
  machine: { cpus: os.cpus().length, model: os.cpus()[0]?.model, loadavg: os.loadavg().map((x) => Math.round(x * 100) / 100) },
  peers: versions,
  results,
}, null, 1))
