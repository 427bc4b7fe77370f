#!/usr/bin/env node
// The peers' half of corral's benchmarks (issue 5): the sandboxes a user would
// pick instead of corral, measured on the same workloads, in the same run.
//
//   node run.mjs [--quick] [--only workload,...] [--peers peer,...]
//
// prints ONE JSON document on stdout (progress goes to stderr):
//   {"node", "date", "mode", "peers": {peer: version}, "machine": {cpus, model},
//    "results": [{peer, workload, unit, n, p50, p99, min, max, mean, note?}, ...]}
//
// Every (peer, workload) pair runs in its own child process (`--child`), so a
// peer's garbage, JIT state or a crash cannot pollute another's figures; the
// peers are interleaved within each workload so that the machine's noise falls
// on all of them alike. Install the peers first with ./install.sh.

import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import os from 'node:os'
import path from 'node:path'
import vm from 'node:vm'

const require = createRequire(import.meta.url)
const HERE = path.dirname(fileURLToPath(import.meta.url))

const WORKLOADS = [
  'new_session',
  'fib27',
  'call_roundtrip',
  'concurrent_calls',
  'rss_per_session',
  'deadline_overshoot',
  'process_start',
]
const PEERS = ['quickjs-emscripten-shared', 'quickjs-emscripten-fresh', 'node-vm', 'isolated-vm']
// node-bare is the baseline of process_start only: plain `node -e '1+1'`.
const BASELINE = 'node-bare'

const UNITS = {
  new_session: 'us',
  fib27: 'ms',
  call_roundtrip: 'us',
  concurrent_calls: 'ms',
  rss_per_session: 'KiB',
  // Measured by the rss_per_session child, beside RSS.
  pss_per_session: 'KiB',
  private_per_session: 'KiB',
  deadline_overshoot: 'ms',
  process_start: 'ms',
}

const SRC_1P1 = '(function(){return 1+1})()'
const SRC_FIB = 'function fib(n){return n<2?n:fib(n-1)+fib(n-2)} fib(27)'
const FIB27 = 196418
const SRC_LOOP = 'while(true){}'
const DEADLINE_MS = 100
const CONCURRENT_CALLS = 100
const HOST_DELAY_MS = 10
const RSS_SESSIONS = 100

// Iteration counts: [full, quick].
function counts(quick) {
  const q = (full, small) => (quick ? small : full)
  return {
    newSession: q(2000, 100),
    newSessionFresh: q(200, 10),
    fibRuns: q(5, 1),
    roundtripCalls: q(10000, 1000),
    roundtripRuns: 5,
    concurrentRuns: 5,
    deadlineRuns: 5,
    processRuns: q(20, 3),
  }
}

const now = () => process.hrtime.bigint()
const nsToUs = (ns) => Number(ns) / 1e3
const nsToMs = (ns) => Number(ns) / 1e6
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
// Warm-up before measuring: V8 first compiles WebAssembly (and JS) with a
// baseline tier and only later optimises hot code, so quickjs-emscripten in
// particular runs several times slower on its first few hundred sessions.
const WARM_SESSIONS = (iters) => Math.max(300, Math.floor(iters / 5))
const WARM_FIB_RUNS = 2

function stats(samples) {
  const s = [...samples].sort((a, b) => a - b)
  const n = s.length
  const pct = (p) => s[Math.min(n - 1, Math.max(0, Math.ceil((p / 100) * n) - 1))]
  const r = (x) => Math.round(x * 1000) / 1000
  return {
    n,
    p50: r(pct(50)),
    p99: r(pct(99)),
    min: r(s[0]),
    max: r(s[n - 1]),
    mean: r(s.reduce((a, b) => a + b, 0) / n),
  }
}

function result(peer, workload, samples, note) {
  const out = { peer, workload, unit: UNITS[workload] }
  if (!samples || samples.length === 0) {
    Object.assign(out, { n: 0, p50: null, p99: null, min: null, max: null, mean: null })
  } else {
    Object.assign(out, stats(samples))
  }
  if (note) out.note = note
  return out
}

function gc() {
  if (typeof globalThis.gc === 'function') {
    globalThis.gc()
    globalThis.gc()
  }
}

// ---------------------------------------------------------------------------
// Peers. Each adapter implements the workloads with that peer's own API.
// ---------------------------------------------------------------------------

function quickjsPeer(fresh) {
  let Q
  let shared
  const module = fresh ? () => Q.newQuickJSWASMModule() : () => shared
  const peer = fresh ? 'quickjs-emscripten-fresh' : 'quickjs-emscripten-shared'

  function evalNumber(ctx, src) {
    const r = ctx.evalCode(src)
    if (r.error) {
      const e = ctx.dump(r.error)
      r.error.dispose()
      throw new Error(`${peer}: eval failed: ${JSON.stringify(e)}`)
    }
    const v = ctx.getNumber(r.value)
    r.value.dispose()
    return v
  }

  function onePlusOne(mod) {
    const rt = mod.newRuntime()
    const ctx = rt.newContext()
    const v = evalNumber(ctx, SRC_1P1)
    ctx.dispose()
    rt.dispose()
    if (v !== 2) throw new Error(`${peer}: 1+1 gave ${v}`)
  }

  // Runs an async script to completion with the library's documented pattern:
  // host functions return `vm.newPromise()` handles and, once those settle,
  // call `runtime.executePendingJobs()`; the script's own promise is turned
  // into a host promise with `vm.resolvePromise()`.
  async function runAsync(rt, ctx, src) {
    const promiseHandle = ctx.unwrapResult(ctx.evalCode(src))
    const hostPromise = ctx.resolvePromise(promiseHandle)
    promiseHandle.dispose()
    rt.executePendingJobs()
    const h = ctx.unwrapResult(await hostPromise)
    const v = ctx.getNumber(h)
    h.dispose()
    return v
  }

  function installHost(rt, ctx, name, settle) {
    const fn = ctx.newFunction(name, () => {
      const deferred = ctx.newPromise()
      deferred.settled.then(() => rt.executePendingJobs())
      settle(deferred)
      // The returned handle is duplicated into the VM and disposed by the library.
      return deferred.handle
    })
    ctx.setProp(ctx.global, name, fn)
    fn.dispose()
  }

  return {
    peer,
    async init() {
      Q = require('quickjs-emscripten')
      if (!fresh) shared = await Q.getQuickJS()
      else await Q.newQuickJSWASMModule() // warm the file cache and the wasm compiler
    },
    version() {
      return `quickjs-emscripten@${require('quickjs-emscripten/package.json').version}`
    },

    async newSession(iters) {
      const samples = []
      if (fresh) {
        const warm = Math.max(5, Math.floor(iters / 10))
        for (let i = 0; i < warm; i++) onePlusOne(await module())
        for (let i = 0; i < iters; i++) {
          const t0 = now()
          onePlusOne(await module())
          samples.push(nsToUs(now() - t0))
        }
        return {
          samples,
          note: 'newQuickJSWASMModule() (release-sync variant) + newRuntime() + newContext() per session',
        }
      }
      const mod = module()
      for (let i = 0; i < WARM_SESSIONS(iters); i++) onePlusOne(mod)
      for (let i = 0; i < iters; i++) {
        const t0 = now()
        onePlusOne(mod)
        samples.push(nsToUs(now() - t0))
      }
      return { samples, note: 'getQuickJS() once; newRuntime() + newContext() per session' }
    },

    async fib27(runs) {
      const samples = []
      // warm-up: the same script in throwaway sandboxes (lets V8 tier up the
      // interpreter's WebAssembly; a fresh module reuses V8's compiled code)
      for (let i = 0; i < WARM_FIB_RUNS; i++) {
        const rt = (await module()).newRuntime()
        const ctx = rt.newContext()
        evalNumber(ctx, SRC_FIB)
        ctx.dispose()
        rt.dispose()
      }
      for (let i = 0; i < runs; i++) {
        const rt = (await module()).newRuntime()
        const ctx = rt.newContext()
        const t0 = now()
        const v = evalNumber(ctx, SRC_FIB)
        samples.push(nsToMs(now() - t0))
        ctx.dispose()
        rt.dispose()
        if (v !== FIB27) throw new Error(`${peer}: fib(27) gave ${v}`)
      }
      return { samples, note: 'evaluation only, in a new runtime+context; no interrupt handler' }
    },

    async callRoundtrip(calls, runs) {
      const rt = (await module()).newRuntime()
      const ctx = rt.newContext()
      installHost(rt, ctx, 'host', (d) => d.resolve())
      const src = (n) => `(async () => { for (let i = 0; i < ${n}; i++) await host(); return ${n} })()`
      await runAsync(rt, ctx, src(calls))
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await runAsync(rt, ctx, src(calls))
        samples.push(nsToUs(now() - t0) / calls)
        if (v !== calls) throw new Error(`${peer}: roundtrip returned ${v}`)
      }
      ctx.dispose()
      rt.dispose()
      return {
        samples,
        note:
          `${calls} awaited calls per run; host() returns vm.newPromise() resolved synchronously by the host, ` +
          'deferred.settled.then(executePendingJobs), script promise via vm.resolvePromise()',
      }
    },

    async concurrentCalls(runs) {
      const rt = (await module()).newRuntime()
      const ctx = rt.newContext()
      installHost(rt, ctx, 'host', (d) => setTimeout(() => d.resolve(), HOST_DELAY_MS))
      const src = `(async () => { await Promise.all(Array.from({length: ${CONCURRENT_CALLS}}, () => host())); return ${CONCURRENT_CALLS} })()`
      await runAsync(rt, ctx, src)
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await runAsync(rt, ctx, src)
        samples.push(nsToMs(now() - t0))
        if (v !== CONCURRENT_CALLS) throw new Error(`${peer}: concurrent returned ${v}`)
      }
      ctx.dispose()
      rt.dispose()
      return { samples, note: `host() = vm.newPromise() resolved by a ${HOST_DELAY_MS} ms setTimeout` }
    },

    async liveSessions(count) {
      const keep = []
      for (let i = 0; i < count; i++) {
        const mod = await module()
        const rt = mod.newRuntime()
        const ctx = rt.newContext()
        if (evalNumber(ctx, SRC_1P1) !== 2) throw new Error('1+1')
        keep.push({ mod, rt, ctx })
      }
      return {
        keep,
        dispose() {
          for (const s of keep) {
            s.ctx.dispose()
            s.rt.dispose()
          }
        },
        note: fresh
          ? 'each session owns its own WebAssembly module instance and linear memory'
          : 'sessions share one WebAssembly module (one linear memory that grows)',
      }
    },

    async deadline(runs) {
      const one = async (ms) => {
        const rt = (await module()).newRuntime()
        const ctx = rt.newContext()
        const t0 = now()
        const deadline = t0 + BigInt(ms) * 1_000_000n
        // The library's own shouldInterruptAfterDeadline() compares Date.now()
        // (1 ms resolution); the same interrupt handler with hrtime is exact.
        rt.setInterruptHandler(() => now() > deadline)
        const r = ctx.evalCode(SRC_LOOP)
        const t1 = now()
        if (!r.error) throw new Error(`${peer}: infinite loop returned`)
        const e = ctx.dump(r.error)
        r.error.dispose()
        ctx.dispose()
        rt.dispose()
        if (!/interrupted/.test(JSON.stringify(e))) throw new Error(`${peer}: unexpected error ${JSON.stringify(e)}`)
        return nsToMs(t1 - t0) - ms
      }
      await one(5)
      const samples = []
      for (let r = 0; r < runs; r++) samples.push(await one(DEADLINE_MS))
      return { samples, note: 'runtime.setInterruptHandler(() => hrtime > deadline)' }
    },

    program: fresh
      ? `require('quickjs-emscripten').newQuickJSWASMModule().then(Q=>{const rt=Q.newRuntime();const c=rt.newContext();const h=c.unwrapResult(c.evalCode(${JSON.stringify(SRC_1P1)}));const v=c.getNumber(h);h.dispose();c.dispose();rt.dispose();if(v!==2)process.exit(3)})`
      : `require('quickjs-emscripten').getQuickJS().then(Q=>{const rt=Q.newRuntime();const c=rt.newContext();const h=c.unwrapResult(c.evalCode(${JSON.stringify(SRC_1P1)}));const v=c.getNumber(h);h.dispose();c.dispose();rt.dispose();if(v!==2)process.exit(3)})`,
  }
}

function nodeVmPeer() {
  const peer = 'node-vm'
  const onePlusOne = () => {
    const ctx = vm.createContext({})
    const v = vm.runInContext(SRC_1P1, ctx)
    if (v !== 2) throw new Error(`${peer}: 1+1 gave ${v}`)
  }
  return {
    peer,
    async init() {},
    version() {
      return `node:vm (node ${process.version})`
    },
    async newSession(iters) {
      for (let i = 0; i < WARM_SESSIONS(iters); i++) onePlusOne()
      const samples = []
      for (let i = 0; i < iters; i++) {
        const t0 = now()
        onePlusOne()
        samples.push(nsToUs(now() - t0))
      }
      return {
        samples,
        note: 'vm.createContext({}) + vm.runInContext(); no explicit dispose (contexts are garbage-collected)',
      }
    },
    async fib27(runs) {
      for (let i = 0; i < WARM_FIB_RUNS; i++) vm.runInContext(SRC_FIB, vm.createContext({}))
      const samples = []
      for (let i = 0; i < runs; i++) {
        const ctx = vm.createContext({})
        const t0 = now()
        const v = vm.runInContext(SRC_FIB, ctx)
        samples.push(nsToMs(now() - t0))
        if (v !== FIB27) throw new Error(`${peer}: fib(27) gave ${v}`)
      }
      return {
        samples,
        note:
          'V8 with its JIT, in a new context; no timeout. fib is a global of the context, and every global ' +
          "lookup in a vm context goes through node's interceptor on the context object, which is what makes " +
          'this slower than isolated-vm (wrapping the same code in a function takes about 4 ms)',
      }
    },
    async callRoundtrip(calls, runs) {
      const ctx = vm.createContext({ host: async () => {} })
      const src = (n) => `(async () => { for (let i = 0; i < ${n}; i++) await host(); return ${n} })()`
      await vm.runInContext(src(calls), ctx)
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await vm.runInContext(src(calls), ctx)
        samples.push(nsToUs(now() - t0) / calls)
        if (v !== calls) throw new Error(`${peer}: roundtrip returned ${v}`)
      }
      return { samples, note: `${calls} awaited calls per run; host = an async function of the host realm injected into the context` }
    },
    async concurrentCalls(runs) {
      const ctx = vm.createContext({ host: () => new Promise((r) => setTimeout(r, HOST_DELAY_MS)) })
      const src = `(async () => { await Promise.all(Array.from({length: ${CONCURRENT_CALLS}}, () => host())); return ${CONCURRENT_CALLS} })()`
      await vm.runInContext(src, ctx)
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await vm.runInContext(src, ctx)
        samples.push(nsToMs(now() - t0))
        if (v !== CONCURRENT_CALLS) throw new Error(`${peer}: concurrent returned ${v}`)
      }
      return { samples, note: `host() returns a host Promise resolved by a ${HOST_DELAY_MS} ms setTimeout` }
    },
    async liveSessions(count) {
      const keep = []
      for (let i = 0; i < count; i++) {
        const ctx = vm.createContext({})
        if (vm.runInContext(SRC_1P1, ctx) !== 2) throw new Error('1+1')
        keep.push(ctx)
      }
      return { keep, dispose() {}, note: 'contexts share the process isolate' }
    },
    async deadline(runs) {
      const one = (ms) => {
        const ctx = vm.createContext({})
        const t0 = now()
        try {
          vm.runInContext(SRC_LOOP, ctx, { timeout: ms })
        } catch (e) {
          const t1 = now()
          if (e.code !== 'ERR_SCRIPT_EXECUTION_TIMEOUT') throw e
          return nsToMs(t1 - t0) - ms
        }
        throw new Error(`${peer}: infinite loop returned`)
      }
      one(5)
      const samples = []
      for (let r = 0; r < runs; r++) samples.push(one(DEADLINE_MS))
      return { samples, note: 'vm.runInContext(code, ctx, { timeout: 100 })' }
    },
    program: `const vm=require('vm');const v=vm.runInContext(${JSON.stringify(SRC_1P1)},vm.createContext({}));if(v!==2)process.exit(3)`,
  }
}

function isolatedVmPeer() {
  const peer = 'isolated-vm'
  let ivm
  const onePlusOne = () => {
    const iso = new ivm.Isolate()
    const ctx = iso.createContextSync()
    const v = ctx.evalSync(SRC_1P1)
    ctx.release()
    iso.dispose()
    if (v !== 2) throw new Error(`${peer}: 1+1 gave ${v}`)
  }
  // A host function callable from the isolate that returns a promise: an
  // ivm.Reference to a host function, applied with { result: { promise: true } }
  // (the async counterpart of applySyncPromise: the isolate is not blocked, so
  // calls can overlap).
  const installHost = (ctx, name, fn) => {
    ctx.global.setSync(`__${name}_ref`, new ivm.Reference(fn))
    ctx.evalSync(
      `globalThis.${name} = () => __${name}_ref.apply(undefined, [], { result: { promise: true } })`,
    )
  }
  return {
    peer,
    async init() {
      ivm = require('isolated-vm')
    },
    version() {
      return `isolated-vm@${require('isolated-vm/package.json').version}`
    },
    async newSession(iters) {
      for (let i = 0; i < WARM_SESSIONS(iters); i++) onePlusOne()
      const samples = []
      for (let i = 0; i < iters; i++) {
        const t0 = now()
        onePlusOne()
        samples.push(nsToUs(now() - t0))
      }
      return { samples, note: 'new ivm.Isolate() + createContextSync() + evalSync() + isolate.dispose()' }
    },
    async fib27(runs) {
      for (let i = 0; i < WARM_FIB_RUNS; i++) {
        const iso = new ivm.Isolate()
        iso.createContextSync().evalSync(SRC_FIB)
        iso.dispose()
      }
      const samples = []
      for (let i = 0; i < runs; i++) {
        const iso = new ivm.Isolate()
        const ctx = iso.createContextSync()
        const t0 = now()
        const v = ctx.evalSync(SRC_FIB)
        samples.push(nsToMs(now() - t0))
        iso.dispose()
        if (v !== FIB27) throw new Error(`${peer}: fib(27) gave ${v}`)
      }
      return { samples, note: 'V8 with its JIT, in a new isolate; no timeout' }
    },
    async callRoundtrip(calls, runs) {
      const iso = new ivm.Isolate()
      const ctx = iso.createContextSync()
      installHost(ctx, 'host', async () => {})
      const src = (n) => `(async () => { for (let i = 0; i < ${n}; i++) await host(); return ${n} })()`
      await ctx.eval(src(calls), { promise: true })
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await ctx.eval(src(calls), { promise: true })
        samples.push(nsToUs(now() - t0) / calls)
        if (v !== calls) throw new Error(`${peer}: roundtrip returned ${v}`)
      }
      iso.dispose()
      return {
        samples,
        note: `${calls} awaited calls per run; host = ivm.Reference(async fn).apply(..., { result: { promise: true } }), crossing threads each call`,
      }
    },
    async concurrentCalls(runs) {
      const iso = new ivm.Isolate()
      const ctx = iso.createContextSync()
      installHost(ctx, 'host', () => new Promise((r) => setTimeout(r, HOST_DELAY_MS)))
      const src = `(async () => { await Promise.all(Array.from({length: ${CONCURRENT_CALLS}}, () => host())); return ${CONCURRENT_CALLS} })()`
      await ctx.eval(src, { promise: true })
      const samples = []
      for (let r = 0; r < runs; r++) {
        const t0 = now()
        const v = await ctx.eval(src, { promise: true })
        samples.push(nsToMs(now() - t0))
        if (v !== CONCURRENT_CALLS) throw new Error(`${peer}: concurrent returned ${v}`)
      }
      iso.dispose()
      return { samples, note: `host() = ivm.Reference apply with result promise, resolved by a ${HOST_DELAY_MS} ms setTimeout` }
    },
    async liveSessions(count) {
      const keep = []
      for (let i = 0; i < count; i++) {
        const iso = new ivm.Isolate()
        const ctx = iso.createContextSync()
        if (ctx.evalSync(SRC_1P1) !== 2) throw new Error('1+1')
        keep.push({ iso, ctx })
      }
      return {
        keep,
        dispose() {
          for (const s of keep) s.iso.dispose()
        },
        extra() {
          let heap = 0
          for (const s of keep) heap += s.iso.getHeapStatisticsSync().total_heap_size
          return `isolate heaps live in this process, so RSS includes them; total_heap_size of the 100 isolates = ${Math.round(heap / 1024 / RSS_SESSIONS)} KiB per isolate`
        },
        note: 'one V8 isolate per session',
      }
    },
    async deadline(runs) {
      const one = (ms) => {
        const iso = new ivm.Isolate()
        const ctx = iso.createContextSync()
        const t0 = now()
        try {
          ctx.evalSync(SRC_LOOP, { timeout: ms })
        } catch (e) {
          const t1 = now()
          iso.dispose()
          if (!/timed out/.test(String(e && e.message))) throw e
          return nsToMs(t1 - t0) - ms
        }
        throw new Error(`${peer}: infinite loop returned`)
      }
      one(5)
      const samples = []
      for (let r = 0; r < runs; r++) samples.push(one(DEADLINE_MS))
      return { samples, note: 'context.evalSync(code, { timeout: 100 })' }
    },
    program: `const ivm=require('isolated-vm');const i=new ivm.Isolate();const c=i.createContextSync();const v=c.evalSync(${JSON.stringify(SRC_1P1)});i.dispose();if(v!==2)process.exit(3)`,
  }
}

function makePeer(name) {
  switch (name) {
    case 'quickjs-emscripten-shared':
      return quickjsPeer(false)
    case 'quickjs-emscripten-fresh':
      return quickjsPeer(true)
    case 'node-vm':
      return nodeVmPeer()
    case 'isolated-vm':
      return isolatedVmPeer()
    default:
      throw new Error(`unknown peer ${name}`)
  }
}

// ---------------------------------------------------------------------------
// Child: one (peer, workload) pair, one JSON line on stdout.
// ---------------------------------------------------------------------------

async function child(peerName, workload, quick) {
  const c = counts(quick)
  const p = makePeer(peerName)
  await p.init()
  let out
  switch (workload) {
    case 'new_session': {
      const iters = peerName === 'quickjs-emscripten-fresh' ? c.newSessionFresh : c.newSession
      out = await p.newSession(iters)
      break
    }
    case 'fib27':
      out = await p.fib27(c.fibRuns)
      break
    case 'call_roundtrip':
      out = await p.callRoundtrip(c.roundtripCalls, c.roundtripRuns)
      break
    case 'concurrent_calls':
      out = await p.concurrentCalls(c.concurrentRuns)
      break
    case 'deadline_overshoot':
      out = await p.deadline(c.deadlineRuns)
      break
    case 'rss_per_session': {
      if (typeof globalThis.gc !== 'function') throw new Error('run the child with --expose-gc')
      // warm: create and drop a few sessions so that lazily built state exists before the baseline
      ;(await p.liveSessions(3)).dispose()
      gc()
      await sleep(50)
      gc()
      const before = process.memoryUsage()
      const rollupBefore = smapsRollup()
      const live = await p.liveSessions(RSS_SESSIONS)
      gc()
      await sleep(50)
      gc()
      const after = process.memoryUsage()
      const rollupAfter = smapsRollup()
      const perSession = (...fields) => {
        const sum = (rollup) => fields.reduce((total, f) => total + (rollup[f] || 0), 0)
        return (sum(rollupAfter) - sum(rollupBefore)) / RSS_SESSIONS
      }
      const kib = (after.rss - before.rss) / 1024 / RSS_SESSIONS
      const heapKib = (after.heapUsed - before.heapUsed) / 1024 / RSS_SESSIONS
      const extKib = (after.external + after.arrayBuffers - before.external - before.arrayBuffers) / 1024 / RSS_SESSIONS
      let note = `${live.note}; rss ${Math.round(before.rss / 1024)} -> ${Math.round(after.rss / 1024)} KiB for ${RSS_SESSIONS} sessions; per session: node heapUsed ${heapKib.toFixed(1)} KiB, external+arrayBuffers ${extKib.toFixed(1)} KiB`
      if (live.extra) note += `; ${live.extra()}`
      live.dispose()
      // PSS and private memory beside RSS: RSS counts a page shared between sessions once per
      // mapping of it, PSS divides it among them (so within one process counts it once).
      const same = `${RSS_SESSIONS} live sessions; /proc/self/smaps_rollup`
      return [
        result(peerName, workload, [kib], note),
        result(peerName, 'pss_per_session', [perSession('Pss')], `${same} Pss delta / ${RSS_SESSIONS}`),
        result(peerName, 'private_per_session', [perSession('Private_Clean', 'Private_Dirty')], `${same} (Private_Clean + Private_Dirty) delta / ${RSS_SESSIONS}`),
      ]
    }
    default:
      throw new Error(`workload ${workload} does not run in a child`)
  }
  return result(peerName, workload, out.samples, out.note)
}

// This process's /proc/self/smaps_rollup as {field: KiB}.
function smapsRollup() {
  const out = {}
  for (const line of fs.readFileSync('/proc/self/smaps_rollup', 'utf8').split('\n')) {
    const m = /^(\w+):\s+(\d+) kB$/.exec(line)
    if (m) out[m[1]] = Number(m[2])
  }
  return out
}

// ---------------------------------------------------------------------------
// Parent.
// ---------------------------------------------------------------------------

function parseArgs(argv) {
  const a = { quick: false, only: null, peers: null, child: null }
  for (let i = 0; i < argv.length; i++) {
    const x = argv[i]
    const val = () => {
      if (x.includes('=')) return x.slice(x.indexOf('=') + 1)
      if (i + 1 >= argv.length) usage(`${x} needs a value`)
      return argv[++i]
    }
    if (x === '--quick') a.quick = true
    else if (x === '--only' || x.startsWith('--only=')) a.only = val().split(',').filter(Boolean)
    else if (x === '--peers' || x.startsWith('--peers=')) a.peers = val().split(',').filter(Boolean)
    else if (x === '--child') {
      a.child = [argv[i + 1], argv[i + 2]]
      i += 2
    } else if (x === '-h' || x === '--help') usage()
    else usage(`unknown argument ${x}`)
  }
  for (const w of a.only || []) if (!WORKLOADS.includes(w)) usage(`unknown workload ${w} (known: ${WORKLOADS.join(', ')})`)
  for (const p of a.peers || []) if (![...PEERS, BASELINE].includes(p)) usage(`unknown peer ${p} (known: ${[...PEERS, BASELINE].join(', ')})`)
  return a
}

function usage(msg) {
  if (msg) process.stderr.write(`run.mjs: ${msg}\n`)
  process.stderr.write(
    `usage: node run.mjs [--quick] [--only ${WORKLOADS.join(',')}] [--peers ${[...PEERS, BASELINE].join(',')}]\n`,
  )
  process.exit(msg ? 2 : 0)
}

// NODE_EXTRA_CA_CERTS makes every node process read a CA bundle at start
// (about 90 ms on this machine, more than node's whole start-up), and
// NODE_OPTIONS could load anything: child processes run without either.
const DROPPED_ENV = ['NODE_EXTRA_CA_CERTS', 'NODE_OPTIONS'].filter((k) => k in process.env)
const CHILD_ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !DROPPED_ENV.includes(k)))

const log = (m) => process.stderr.write(`[peers] ${m}\n`)

function availability(peerName) {
  // Load each optional peer in a throwaway process, so that a broken native
  // addon can neither crash nor slow this one.
  const probe = {
    'quickjs-emscripten-shared': `require('quickjs-emscripten')`,
    'quickjs-emscripten-fresh': `require('quickjs-emscripten')`,
    'isolated-vm': `const ivm=require('isolated-vm');new ivm.Isolate().dispose()`,
  }[peerName]
  if (!probe) return null
  const r = spawnSync(process.execPath, ['-e', probe], { cwd: HERE, env: CHILD_ENV, encoding: 'utf8', timeout: 30000 })
  if (r.status === 0) return null
  const why = (r.stderr || r.error?.message || '').split('\n').find((l) => /Error|error|Cannot/.test(l)) || `exit ${r.status}`
  return `not available: ${why.trim()} (run bench/peers/install.sh)`
}

function peerVersion(peerName) {
  try {
    if (peerName === BASELINE) return `node ${process.version}`
    if (peerName === 'node-vm') return `node:vm (node ${process.version})`
    if (peerName === 'isolated-vm') return `isolated-vm@${require('isolated-vm/package.json').version}`
    return `quickjs-emscripten@${require('quickjs-emscripten/package.json').version}`
  } catch {
    return 'not installed'
  }
}

function runChild(peerName, workload, quick) {
  const args = ['--expose-gc', fileURLToPath(import.meta.url), '--child', peerName, workload]
  if (quick) args.push('--quick')
  const t0 = now()
  const r = spawnSync(process.execPath, args, { cwd: HERE, env: CHILD_ENV, encoding: 'utf8', timeout: 240000, maxBuffer: 1 << 24 })
  const secs = (nsToMs(now() - t0) / 1000).toFixed(1)
  const line = (r.stdout || '').trim().split('\n').pop()
  if (r.status === 0 && line) {
    try {
      const all = [JSON.parse(line)].flat()
      for (const res of all) log(`${res.workload} ${peerName}: p50 ${res.p50} ${res.unit} (n=${res.n}, ${secs}s)`)
      return all
    } catch {}
  }
  const err = (r.stderr || '').trim().split('\n').slice(-3).join(' | ') || r.error?.message || ''
  const why = r.signal ? `child killed by ${r.signal}` : `child exited ${r.status}`
  log(`${workload} ${peerName}: FAILED (${why}) ${err}`)
  return [result(peerName, workload, null, `failed: ${why}: ${err}`.slice(0, 500))]
}

function processStart(peerNames, unavailable, quick) {
  const runs = counts(quick).processRuns
  const programs = {}
  for (const name of peerNames) {
    if (name === BASELINE) programs[name] = '1+1'
    else if (!unavailable[name]) programs[name] = makePeer(name).program
  }
  const names = Object.keys(programs)
  const samples = Object.fromEntries(names.map((n) => [n, []]))
  const failures = {}
  const env = CHILD_ENV
  const envNote = DROPPED_ENV.length ? `; run without ${DROPPED_ENV.join(', ')}` : ''
  const once = (name) => {
    const t0 = now()
    const r = spawnSync(process.execPath, ['-e', programs[name]], {
      cwd: HERE,
      env,
      stdio: ['ignore', 'ignore', 'pipe'],
      encoding: 'utf8',
      timeout: 30000,
    })
    const ms = nsToMs(now() - t0)
    if (r.status !== 0) failures[name] = `exit ${r.status}: ${(r.stderr || '').trim().split('\n').slice(-2).join(' | ')}`
    return ms
  }
  // warm the page cache and anything else shared; then interleave the peers
  for (const n of names) for (let i = 0; i < 2; i++) once(n)
  for (let i = 0; i < runs; i++) for (const n of names) samples[n].push(once(n))
  const out = []
  for (const name of peerNames) {
    if (unavailable[name]) {
      out.push(result(name, 'process_start', null, unavailable[name]))
    } else if (failures[name]) {
      out.push(result(name, 'process_start', null, `failed: ${failures[name]}`.slice(0, 500)))
    } else {
      const note =
        name === BASELINE
          ? `node -e '1+1' (spawnSync wall time, ${runs} runs interleaved with the peers)`
          : `node -e '<create one sandbox, evaluate ${SRC_1P1}>' (spawnSync wall time)` +
            (name === 'quickjs-emscripten-fresh' ? '; one sandbox per process, so the same as shared but for newQuickJSWASMModule()' : '')
      const res = result(name, 'process_start', samples[name], note + envNote)
      log(`process_start ${name}: p50 ${res.p50} ms (n=${res.n})`)
      out.push(res)
    }
  }
  return out
}

async function main() {
  const a = parseArgs(process.argv.slice(2))
  if (a.child) {
    const [peerName, workload] = a.child
    let res
    try {
      res = await child(peerName, workload, a.quick)
    } catch (e) {
      res = result(peerName, workload, null, `error: ${e && e.stack ? e.stack.split('\n').slice(0, 2).join(' ') : e}`)
    }
    process.stdout.write(JSON.stringify(res) + '\n')
    // isolated-vm and wasm modules may keep handles; leave now that the figure is out.
    process.exit(0)
  }

  const started = now()
  const workloads = a.only || WORKLOADS
  const peers = (a.peers || PEERS).filter((p) => p !== BASELINE)
  const withBaseline = !a.peers || a.peers.includes(BASELINE)

  const unavailable = {}
  for (const p of peers) {
    const why = availability(p)
    if (why) {
      unavailable[p] = why
      log(`${p}: ${why}`)
    }
  }

  const doc = {
    node: process.version,
    date: new Date().toISOString(),
    mode: a.quick ? 'quick' : 'full',
    peers: {},
    machine: { cpus: os.cpus().length, model: (os.cpus()[0] && os.cpus()[0].model) || 'unknown' },
    results: [],
  }
  for (const p of peers) doc.peers[p] = unavailable[p] ? `${peerVersion(p)} (${unavailable[p]})` : peerVersion(p)
  if (withBaseline && workloads.includes('process_start')) doc.peers[BASELINE] = peerVersion(BASELINE)

  for (const w of workloads) {
    if (w === 'process_start') {
      const names = withBaseline ? [BASELINE, ...peers] : peers
      doc.results.push(...processStart(names, unavailable, a.quick))
      continue
    }
    for (const p of peers) {
      if (unavailable[p]) doc.results.push(result(p, w, null, unavailable[p]))
      else doc.results.push(...runChild(p, w, a.quick))
    }
  }
  log(`done in ${(nsToMs(now() - started) / 1000).toFixed(1)} s`)
  process.stdout.write(JSON.stringify(doc, null, 2) + '\n')
}

main().catch((e) => {
  process.stderr.write(`run.mjs: ${e && e.stack ? e.stack : e}\n`)
  process.exit(1)
})
