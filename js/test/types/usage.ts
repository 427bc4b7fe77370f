// Compiled with `tsc --strict --noEmit` by test/types.test.mjs: the package's types must let a
// typed embedder write this without casts, and must reject the misuse at the end.
import { createSandbox, exampleCatalog, exampleTools, type ScriptReport, type Tool } from '@corral/sandbox'

const lookup: Tool = async (input: { id: number }, { signal, toolCallId }) => {
  signal.throwIfAborted()
  return { id: input.id, by: toolCallId }
}

async function main(): Promise<number> {
  const sandbox = createSandbox({ stackSizeMb: 4 })
  const session = await sandbox.session({
    tools: { ...exampleTools, crm: { lookup } },
    catalog: exampleCatalog,
    user: { id: 'u-1', displayName: 'Ada' },
    limits: { timeout_ms: 1000, max_concurrent_calls: 4 },
    clock: { frozen: { unix_ms: 0 } },
  })
  const report: ScriptReport = await session.run('return 1 + 1')
  session.close()
  sandbox.close()
  if (report.ok) {
    return typeof report.value === 'number' ? report.value : 0
  }
  const kind: string = report.error.kind
  console.error(kind, report.error.calls_started ?? 0, report.stats.wall_us)
  // @ts-expect-error: limits are checked by name
  await sandbox.session({ limits: { timeout: 5 } })
  return -1
}

void main()
