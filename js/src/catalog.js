// Capability definitions in corral's catalog format ({"capabilities": [...]}, as read by the
// Rust host's `corral-catalog`) and validation of call inputs against their JSON Schemas with
// ajv. Violations are worded as the Rust host's `jsonschema` crate words them for the common
// keywords, so a script (and a model reading its error) sees the same message under both hosts.
import Ajv from 'ajv'
import Ajv2019 from 'ajv/dist/2019.js'
import Ajv2020 from 'ajv/dist/2020.js'

/** At most this many violations are listed in a ValidationError; the rest are counted. */
export const MAX_REPORTED_VIOLATIONS = 16
/** Each violation's message is cut to this many characters. */
export const MAX_VIOLATION_MESSAGE_CHARS = 240

const FIELDS = new Set([
  'id', 'js_path', 'description', 'input_schema', 'output_schema', 'examples', 'text_output', 'needs_approval',
])

// verbose: errors carry the offending value, which the messages quote as the Rust host's do.
const ajvOptions = { allErrors: true, strict: false, validateFormats: false, verbose: true }
let validators = null
/** The ajv instance for a schema's draft (2020-12 when `$schema` does not say, like the Rust host). */
function ajvFor(schema) {
  validators ??= { 2020: new Ajv2020(ajvOptions), 2019: new Ajv2019(ajvOptions), 7: new Ajv(ajvOptions) }
  const draft = typeof schema === 'object' && schema !== null ? String(schema.$schema ?? '') : ''
  if (draft.includes('2019-09')) return validators[2019]
  if (/draft-0[4-7]/.test(draft)) return validators[7]
  return validators[2020]
}

/** Why a catalog could not be loaded. */
export class CatalogError extends Error {
  constructor(message) {
    super(message)
    this.name = 'CatalogError'
  }
}

/**
 * A checked catalog with compiled input validators.
 * @param {unknown} definition `{capabilities: [...]}` or its JSON text
 */
export function loadCatalog(definition) {
  const document = typeof definition === 'string' ? JSON.parse(definition) : definition
  if (typeof document !== 'object' || document === null || !Array.isArray(document.capabilities)) {
    throw new CatalogError('the catalog has no "capabilities" list at its top level')
  }
  const unknownTop = Object.keys(document).filter((key) => key !== 'capabilities')
  if (unknownTop.length > 0) throw new CatalogError(`unknown field ${JSON.stringify(unknownTop[0])} at the catalog's top level`)
  const byId = new Map()
  const capabilities = document.capabilities.map((entry, position) => {
    if (typeof entry !== 'object' || entry === null) throw new CatalogError(`capability at position ${position} is not an object`)
    for (const key of Object.keys(entry)) {
      if (!FIELDS.has(key)) throw new CatalogError(`capability at position ${position}: unknown field ${JSON.stringify(key)}`)
    }
    const { id } = entry
    if (typeof id !== 'string' || id === '' || /[\s\p{Cc}]/u.test(id)) {
      throw new CatalogError(`capability at position ${position} has an invalid id ${JSON.stringify(id)}`)
    }
    if (byId.has(id)) throw new CatalogError(`capability id ${id} is defined twice, at positions ${byId.get(id)} and ${position}`)
    byId.set(id, position)
    const jsPath = entry.js_path ?? id.split('.')
    if (!Array.isArray(jsPath) || jsPath.length === 0 || jsPath.some((part) => typeof part !== 'string' || part === '')) {
      throw new CatalogError(`capability ${id}: js_path must be a non-empty list of non-empty strings`)
    }
    const schema = entry.input_schema
    if (typeof schema !== 'boolean' && (typeof schema !== 'object' || schema === null || Array.isArray(schema))) {
      throw new CatalogError(`capability ${id}: input schema must be an object or a boolean`)
    }
    if (entry.text_output === true && entry.output_schema !== undefined) {
      throw new CatalogError(`capability ${id}: text_output is true, so it cannot have an output_schema`)
    }
    let validate
    try {
      validate = ajvFor(schema).compile(schema)
    } catch (error) {
      throw new CatalogError(`capability ${id}: input schema is invalid: ${error.message}`)
    }
    const capability = {
      id,
      jsPath,
      description: entry.description,
      textOutput: entry.text_output === true,
      validate,
    }
    for (const [index, example] of (entry.examples ?? []).entries()) {
      const error = validateInput(capability, example)
      if (error !== null) throw new CatalogError(`capability ${id}: example /examples/${index} does not match the input schema: ${error}`)
    }
    return capability
  })
  return { capabilities, byId }
}

/** `null` when `input` satisfies the capability's schema, else the ValidationError's message. */
export function validateInput(capability, input) {
  if (capability.validate(input)) return null
  const violations = []
  // ajv reports each unexpected property apart; the Rust host lists them in one violation.
  const extra = new Map()
  for (const error of capability.validate.errors ?? []) {
    if (error.keyword === 'additionalProperties') {
      const list = extra.get(error.instancePath)
      if (list) {
        list.push(error.params.additionalProperty)
        continue
      }
      const names = [error.params.additionalProperty]
      extra.set(error.instancePath, names)
      violations.push({ pointer: error.instancePath, describe: () => unexpected(names) })
      continue
    }
    violations.push({ pointer: error.instancePath, describe: () => describe(error) })
  }
  const shown = violations.slice(0, MAX_REPORTED_VIOLATIONS).map(({ pointer, describe }) => {
    return `${pointer === '' ? '(root)' : pointer}: ${truncate(describe())}`
  })
  let list = shown.join('; ')
  if (violations.length > shown.length) list += `; and ${violations.length - shown.length} more`
  return `input for ${capability.id} is invalid: ${list}`
}

function unexpected(names) {
  const quoted = names.map((name) => `'${name}'`).join(', ')
  return `Additional properties are not allowed (${quoted} ${names.length === 1 ? 'was' : 'were'} unexpected)`
}

const json = (value) => JSON.stringify(value)

/** One ajv error in the words of the `jsonschema` crate, where they differ. */
function describe(error) {
  const value = json(error.data)
  const p = error.params
  switch (error.keyword) {
    case 'type': {
      const types = Array.isArray(p.type) ? p.type : String(p.type).split(',')
      return types.length === 1
        ? `${value} is not of type ${json(types[0])}`
        : `${value} is not of types ${types.map(json).join(', ')}`
    }
    case 'required':
      return `${json(p.missingProperty)} is a required property`
    case 'minimum':
      return `${value} is less than the minimum of ${p.limit}`
    case 'maximum':
      return `${value} is greater than the maximum of ${p.limit}`
    case 'exclusiveMinimum':
      return `${value} is less than or equal to the minimum of ${p.limit}`
    case 'exclusiveMaximum':
      return `${value} is greater than or equal to the maximum of ${p.limit}`
    case 'enum':
      return `${value} is not one of ${json(p.allowedValues)}`
    case 'const':
      return `${json(p.allowedValue)} was expected`
    case 'minLength':
      return `${value} is shorter than ${p.limit} character${p.limit === 1 ? '' : 's'}`
    case 'maxLength':
      return `${value} is longer than ${p.limit} character${p.limit === 1 ? '' : 's'}`
    case 'pattern':
      return `${value} does not match ${json(p.pattern)}`
    case 'minItems':
      return `${value} has less than ${p.limit} item${p.limit === 1 ? '' : 's'}`
    case 'maxItems':
      return `${value} has more than ${p.limit} item${p.limit === 1 ? '' : 's'}`
    case 'false schema':
      return 'False schema does not allow ' + value
    default:
      return `${value} ${error.message}`
  }
}

function truncate(message) {
  const chars = [...message]
  return chars.length > MAX_VIOLATION_MESSAGE_CHARS ? chars.slice(0, MAX_VIOLATION_MESSAGE_CHARS).join('') + '...' : message
}
