// The built-in example capabilities of the Rust host (host/sandbox/src/examples.rs), for tests,
// benchmarks and trying the sandbox without writing tools: examples.echo, .sleep, .text, .fail.
import { setTimeout as sleep } from 'node:timers/promises'

/** The catalog of the example capabilities, in corral's catalog format. */
export const exampleCatalog = {
  capabilities: [
    {
      id: 'examples.echo',
      description: 'Returns its input unchanged.',
      input_schema: { type: 'object' },
      examples: [{ hello: 'world' }],
    },
    {
      id: 'examples.sleep',
      description: 'Waits `ms` milliseconds on the host, then returns {slept_ms}. Other calls keep running meanwhile.',
      input_schema: {
        type: 'object',
        properties: { ms: { type: 'integer', minimum: 0, maximum: 60000 } },
        required: ['ms'],
        additionalProperties: false,
      },
      output_schema: {
        type: 'object',
        properties: { slept_ms: { type: 'integer' } },
        required: ['slept_ms'],
      },
      examples: [{ ms: 100 }],
    },
    {
      id: 'examples.text',
      description: 'Returns `text` as a plain string.',
      input_schema: {
        type: 'object',
        properties: { text: { type: 'string' } },
        required: ['text'],
        additionalProperties: false,
      },
      text_output: true,
    },
    {
      id: 'examples.fail',
      description: 'Always fails with the given message.',
      input_schema: {
        type: 'object',
        properties: { message: { type: 'string' } },
        required: ['message'],
        additionalProperties: false,
      },
    },
  ],
}

/** Implementations of the example capabilities, keyed by capability id. */
export const exampleTools = {
  'examples.echo': async (input) => input,
  'examples.sleep': async ({ ms }, { signal }) => {
    await sleep(ms, undefined, { signal })
    return { slept_ms: ms }
  },
  'examples.text': async ({ text }) => text,
  'examples.fail': async ({ message }) => {
    throw new Error(message)
  },
}
