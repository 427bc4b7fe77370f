// Types of @corral/sandbox (hand-written; src/index.js is the implementation).

/** Any value JSON can carry. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue }

/** What a tool is given besides the script's argument. */
export interface ToolContext {
  /** Canonical id of the capability called, such as `examples.echo`. */
  capabilityId: string
  /** `<session id>:<script number>:<call id>`, as the guest reports it in errors. */
  toolCallId: string
  /** The session's id. */
  sessionId: string
  /** Aborted when the script ends (or is stopped) before the call finished. */
  signal: AbortSignal
}

/**
 * A capability implemented in JavaScript. Its resolved value reaches the script as JSON (a string
 * for `text_output` capabilities); a rejection reaches it as a `CapabilityError` whose message is
 * `<id> failed: <message>` (`PermissionDenied` when the error's `name` is `PermissionDenied`).
 */
export type Tool = (input: any, context: ToolContext) => unknown

/** Tools keyed by capability id (`{'github.issues.list': fn}`) or nested by JS path. */
export interface Tools {
  [idOrPart: string]: Tool | Tools
}

/** One capability in corral's catalog format (as `corral catalog check` reads it). */
export interface CapabilityDefinition {
  id: string
  js_path?: string[]
  description?: string
  input_schema: Record<string, unknown> | boolean
  output_schema?: Record<string, unknown> | boolean
  examples?: JsonValue[]
  text_output?: boolean
  needs_approval?: boolean
}

/** corral's catalog format: `{"capabilities": [...]}`. */
export interface Catalog {
  capabilities: CapabilityDefinition[]
}

/** Per-script limits; the same fields and defaults as the Rust host's SessionLimits. */
export interface SessionLimits {
  /** Accepted for compatibility but not enforced: a JS engine cannot meter fuel (see README). */
  fuel?: number
  /** Wall-clock budget per script in ms, computing and waiting alike (default 30000). */
  timeout_ms?: number
  /** Cap on the guest's linear memory in bytes (default 64 MiB, at most 1 GiB). */
  memory_bytes?: number
  /** Calls in flight at once; more wait in a queue (default 8). */
  max_concurrent_calls?: number
  /** Calls a script may start in all (default 1000). */
  max_total_calls?: number
  /** Size of the JSON text of a script's result (default 1 MiB). */
  max_result_bytes?: number
  /** Total size of a script's log messages and fields (default 256 KiB). */
  max_log_bytes?: number
  /** Size of a script's source text (default 256 KiB). */
  max_script_bytes?: number
}

/** The user scripts see as the frozen global `user`; for display only, it authorizes nothing. */
export interface ScriptUser {
  id: string
  email?: string | null
  displayName?: string | null
}

export interface SessionOptions {
  /** The capabilities granted. Nothing else is callable (deny-all by default). */
  tools?: Tools
  /**
   * When given, the catalog decides what is bound and every call's input is validated against
   * its capability's `input_schema` first (`ValidationError`, kind `invalid_input`); a
   * capability without a tool fails when called (`unknown capability`).
   */
  catalog?: Catalog | string
  user?: ScriptUser | null
  limits?: SessionLimits
  /** Prefixes script ids and tool call ids (default ""). */
  id?: string
  /** What `Date.now()` sees: frozen at 0 by default, or the host's clock. */
  clock?: 'real' | { frozen: { unix_ms: number } }
  /** Seed of `Math.random`: 0 by default, or fresh randomness. */
  entropy?: 'host' | { seeded: { seed: number | bigint } }
}

export interface SandboxOptions {
  /** V8 stack of each guest worker in MiB; bounds JavaScript recursion depth (default 4). */
  stackSizeMb?: number
  /** Keep a started worker ready for the next session (default true). */
  spareWorker?: boolean
}

export interface LogRecord {
  /** `<session id>:<script number>`. */
  script_id: string
  level: 'debug' | 'info' | 'warn' | 'error'
  message: string
  fields?: JsonValue
}

export interface RunStats {
  /** Always 0: the JS host does not meter fuel. */
  fuel: number
  wall_us: number
  peak_memory_bytes: number
  calls: number
}

/** The kinds of error the Rust host reports, of which the JS host produces all but fuel_exhausted. */
export type ErrorKind =
  | 'script_error'
  | 'capability_error'
  | 'invalid_input'
  | 'fuel_exhausted'
  | 'deadline_exceeded'
  | 'memory_limit'
  | 'stack_overflow'
  | 'too_many_calls'
  | 'result_too_large'
  | 'logs_too_large'
  | 'session_discarded'
  | 'internal_error'

export interface ExecError {
  kind: ErrorKind
  message: string
  /** Script errors: the error's name, stack and 1-based position in the script. */
  name?: string
  stack?: string
  line?: number
  column?: number
  /** Limits: which one, and how many calls had started (side effects may have happened). */
  limit?: 'fuel' | 'deadline' | 'memory' | 'stack' | 'total_calls' | 'result_size' | 'log_size'
  calls_started?: number
}

/** What `corral exec` prints, and what every run resolves to. */
export type ScriptReport =
  | { ok: true; value?: JsonValue; logs: LogRecord[]; stats: RunStats }
  | { ok: false; error: ExecError; logs: LogRecord[]; stats: RunStats }

export interface Session {
  readonly id: string
  /** Runs a script (the body of an async function); never rejects. */
  run(source: string): Promise<ScriptReport>
  /** Terminates the session's worker; calls still running are abandoned. */
  close(): void
}

export interface Sandbox {
  session(options?: SessionOptions): Promise<Session>
  close(): void
}

export function createSandbox(options?: SandboxOptions): Sandbox

export const DEFAULT_LIMITS: Readonly<Required<SessionLimits>>
export const GUEST_MAX_MEMORY_BYTES: number
export const exampleCatalog: Catalog
export const exampleTools: Tools

export class CatalogError extends Error {}
