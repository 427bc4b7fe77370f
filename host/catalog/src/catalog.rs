//! The validated catalog: loading, the checks that make it safe to bind and render, and input
//! validation with compiled validators.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use crate::capability::{Capability, CatalogFile, McpToolsList};
use crate::js;
use crate::schema::{self, Reference, SchemaRole, display_pointer};

/// At most this many violations are listed in a [`ValidateInputError`]; the rest are counted.
pub const MAX_REPORTED_VIOLATIONS: usize = 16;
/// Each violation's message is cut to this many characters, because messages quote the
/// offending value and a script may send megabytes.
pub const MAX_VIOLATION_MESSAGE_CHARS: usize = 240;

/// A validated, immutable catalog with compiled validators (cheap to share in an `Arc`).
///
/// Every capability has a unique id and a JS path that collides with no other binding, its
/// input schema compiled, its output schema checked against the meta-schema and its examples
/// validated.
#[derive(Clone)]
pub struct Catalog {
    capabilities: Vec<Capability>,
    validators: Vec<Arc<InputValidator>>,
    index_by_id: HashMap<String, usize>,
    /// Each capability's index by its JS path, made the first time a path is looked up.
    index_by_path: OnceLock<HashMap<Vec<String>, usize>>,
}

/// A capability's compiled input validator: compiled when the catalog is built, or for a
/// [`Catalog::built_in_from_json_str`] catalog the first time an input is validated (an error
/// is the schema check's, as text).
type InputValidator = OnceLock<Result<jsonschema::Validator, String>>;

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field(
                "ids",
                &self.capabilities.iter().map(|c| &c.id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Which file format a catalog was read from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatalogFormat {
    /// corral's own `{"capabilities": [...]}`.
    Corral,
    /// An MCP `tools/list` result, `{"tools": [...]}`.
    McpToolsList,
}

impl fmt::Display for CatalogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CatalogFormat::Corral => "corral catalog",
            CatalogFormat::McpToolsList => "MCP tools/list",
        })
    }
}

/// Why a catalog could not be loaded or built. Every variant about one capability names it,
/// and every variant about a place in a document carries its JSON pointer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadCatalogError {
    /// The text is not JSON.
    #[error("the catalog is not valid JSON: {source}")]
    ParseJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON does not have the shape of the format, such as an unknown field.
    #[error(
        "the {format} does not match its format at {pointer}{}: {message}",
        capability.as_ref().map(|id| format!(" (capability {id})")).unwrap_or_default()
    )]
    InvalidDocument {
        /// The format being read.
        format: CatalogFormat,
        /// The capability of the entry at fault, when it has a readable id.
        capability: Option<String>,
        /// JSON pointer to the offending value in the document.
        pointer: String,
        /// What is wrong, from the deserializer.
        message: String,
    },
    /// The JSON is neither of the two formats.
    #[error(
        "the catalog has neither \"capabilities\" (corral catalog) nor \"tools\" (MCP tools/list) at its top level"
    )]
    UnrecognizedFormat,
    /// The namespace given for MCP tools is not a usable id prefix.
    #[error("namespace {namespace:?} {reason}")]
    InvalidNamespace {
        /// The namespace as given.
        namespace: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A capability id is empty or contains whitespace or control characters.
    #[error("capability at position {position} has an invalid id {id:?}: {reason}")]
    InvalidId {
        /// The id as given.
        id: String,
        /// Position of the capability in the list.
        position: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two capabilities share an id.
    #[error("capability id {id} is defined twice, at positions {first} and {second}")]
    DuplicateId {
        /// The shared id.
        id: String,
        /// Position of the first definition.
        first: usize,
        /// Position of the second definition.
        second: usize,
    },
    /// A part of a capability's JS path cannot be bound.
    #[error("capability {capability}: JS part at /js_path/{index} ({part:?}) {reason}")]
    InvalidJsPart {
        /// The capability.
        capability: String,
        /// Index of the part in the JS path.
        index: usize,
        /// The part as given.
        part: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two capabilities would be bound at the same place, or one where the other needs a
    /// namespace object.
    #[error("capabilities {first} and {second} collide at {binding}")]
    BindingCollision {
        /// The capability bound first.
        first: String,
        /// The capability that cannot be bound.
        second: String,
        /// The contested binding, as a JS expression such as `tools.github.issues`.
        binding: String,
    },
    /// A `$ref` needs another document; corral never fetches schemas.
    #[error(
        "capability {capability}: {role} at {} refers to another document ({reference}); only local references are supported",
        display_pointer(pointer)
    )]
    RemoteReference {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the schema holding the `$ref`, within that schema.
        pointer: String,
        /// The `$ref` value.
        reference: String,
    },
    /// A local `$ref` points at nothing.
    #[error(
        "capability {capability}: {role} at {}: reference {reference} points at nothing",
        display_pointer(pointer)
    )]
    UnresolvedReference {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the schema holding the `$ref`, within that schema.
        pointer: String,
        /// The `$ref` value.
        reference: String,
    },
    /// A schema is not valid JSON Schema (checked by the `jsonschema` crate against the
    /// meta-schema of its draft).
    #[error(
        "capability {capability}: {role} is invalid at {}: {message}",
        display_pointer(pointer)
    )]
    InvalidSchema {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the offending keyword, within that schema.
        pointer: String,
        /// What is wrong, from the `jsonschema` crate.
        message: String,
    },
    /// An example input does not satisfy the input schema.
    #[error(
        "capability {capability}: example /examples/{index} does not match the input schema: {source}"
    )]
    InvalidExample {
        /// The capability.
        capability: String,
        /// Index of the example.
        index: usize,
        /// The violations.
        #[source]
        source: ValidateInputError,
    },
    /// A text-output capability also declares an output schema, which would tell the model to
    /// expect structured data it never gets.
    #[error("capability {capability}: text_output is true, so it cannot have an output_schema")]
    TextOutputWithSchema {
        /// The capability.
        capability: String,
    },
    /// `subset` was asked for an id the catalog does not have.
    #[error("capability {id} is not in the catalog")]
    UnknownCapability {
        /// The id asked for.
        id: String,
    },
}

/// One failing place in a call's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputViolation {
    /// JSON pointer into the input (`""` for the input itself).
    pub pointer: String,
    /// Why it fails, cut to [`MAX_VIOLATION_MESSAGE_CHARS`].
    pub message: String,
}

impl fmt::Display for InputViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", display_pointer(&self.pointer), self.message)
    }
}

/// Why a call's input was rejected. The message is what the script's rejected promise carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidateInputError {
    /// The input does not satisfy the capability's input schema.
    #[error("input for {capability} is invalid: {}", list_violations(violations, *omitted))]
    Invalid {
        /// The capability.
        capability: String,
        /// The first [`MAX_REPORTED_VIOLATIONS`] failing places.
        violations: Vec<InputViolation>,
        /// How many more there were.
        omitted: usize,
    },
    /// The index names no capability of this catalog (a host bug, not the script's).
    #[error("no capability at index {index} in this catalog")]
    UnknownCapability {
        /// The index asked for.
        index: usize,
    },
    /// A [`Catalog::built_in_from_json_str`] capability's schema failed its check on first use
    /// (a bug in the program that built the catalog in, not the script's).
    #[error("the input schema of {capability} is unusable: {message}")]
    UnusableSchema {
        /// The capability.
        capability: String,
        /// Why the schema was refused.
        message: String,
    },
}

impl ValidateInputError {
    /// The failing places and why, as (instance pointer, message) pairs.
    pub fn violations(&self) -> &[InputViolation] {
        match self {
            ValidateInputError::Invalid { violations, .. } => violations,
            ValidateInputError::UnknownCapability { .. }
            | ValidateInputError::UnusableSchema { .. } => &[],
        }
    }
}

fn list_violations(violations: &[InputViolation], omitted: usize) -> String {
    let mut list = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if omitted > 0 {
        list.push_str(&format!("; and {omitted} more"));
    }
    list
}

fn truncate_message(message: String) -> String {
    match message.char_indices().nth(MAX_VIOLATION_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &message[..cut]),
        None => message,
    }
}

impl Catalog {
    /// Checks the capabilities (ids unique and well formed, JS parts bindable, no two bindings
    /// colliding, schemas valid and local, examples valid) and compiles their input validators.
    pub fn new(capabilities: Vec<Capability>) -> Result<Catalog, LoadCatalogError> {
        Catalog::build(capabilities).map_err(|(first, _)| first)
    }

    /// Reads, like [`Catalog::from_json_str`], a catalog built into a program (such as
    /// `corral exec`'s examples) whose full check ([`Catalog::from_json_str`]) a test of that
    /// program runs. Ids, JS paths and bindings are checked now; each input schema is checked
    /// and compiled the first time an input is validated against it (a schema that fails then
    /// fails that validation with [`ValidateInputError::UnusableSchema`]). Checking a schema means validating it against
    /// the JSON Schema meta-schema, which the first time in a process costs about 20 ms: a
    /// short-lived program that may never call a capability should not pay it up front.
    pub fn built_in_from_json_str(text: &str) -> Result<Catalog, LoadCatalogError> {
        Catalog::build_with(corral_capabilities(&parse_json(text)?)?, false)
            .map_err(|(first, _)| first)
    }

    /// Checks and compiles, collecting every problem instead of stopping at the first; the
    /// first problem is returned apart so the list is never empty.
    fn build(
        capabilities: Vec<Capability>,
    ) -> Result<Catalog, (LoadCatalogError, Vec<LoadCatalogError>)> {
        Catalog::build_with(capabilities, true)
    }

    /// [`Catalog::build`], with the schemas checked and compiled now (`compile`) or on first use.
    fn build_with(
        capabilities: Vec<Capability>,
        compile: bool,
    ) -> Result<Catalog, (LoadCatalogError, Vec<LoadCatalogError>)> {
        let mut errors = Vec::new();
        let mut index_by_id = HashMap::with_capacity(capabilities.len());
        let mut bindable = vec![true; capabilities.len()];
        for (position, capability) in capabilities.iter().enumerate() {
            if let Err(error) = check_id(&capability.id, position) {
                errors.push(error);
                bindable[position] = false;
                continue;
            }
            if let Some(&first) = index_by_id.get(&capability.id) {
                errors.push(LoadCatalogError::DuplicateId {
                    id: capability.id.clone(),
                    first,
                    second: position,
                });
                bindable[position] = false;
                continue;
            }
            index_by_id.insert(capability.id.clone(), position);
            if let Err(error) = check_js_path(capability) {
                errors.push(error);
                bindable[position] = false;
            }
        }
        errors.extend(check_bindings(&capabilities, &bindable));
        let mut validators = Vec::with_capacity(capabilities.len());
        for capability in &capabilities {
            if !compile {
                validators.push(Arc::new(OnceLock::new()));
                continue;
            }
            match compile_capability(capability) {
                Ok(validator) => {
                    for (index, example) in capability.examples.iter().enumerate() {
                        if let Err(source) = validate_with(&validator, &capability.id, example) {
                            errors.push(LoadCatalogError::InvalidExample {
                                capability: capability.id.clone(),
                                index,
                                source,
                            });
                        }
                    }
                    validators.push(Arc::new(OnceLock::from(Ok(validator))));
                }
                Err(error) => errors.push(error),
            }
        }
        let mut errors = errors.into_iter();
        match errors.next() {
            Some(first) => Err((first, errors.collect())),
            None => Ok(Catalog {
                capabilities,
                validators,
                index_by_id,
                index_by_path: OnceLock::new(),
            }),
        }
    }

    /// Reads corral's catalog format, `{"capabilities": [{"id": ..., "input_schema": ...}]}`.
    pub fn from_json_str(text: &str) -> Result<Catalog, LoadCatalogError> {
        Catalog::new(corral_capabilities(&parse_json(text)?)?)
    }

    /// Reads an MCP `tools/list` result; each tool's id is `namespace.name` (just `name` when
    /// the namespace is empty) and it is bound at `tools.<namespace parts>.<name>`.
    pub fn from_mcp_tools_json(text: &str, namespace: &str) -> Result<Catalog, LoadCatalogError> {
        Catalog::new(mcp_capabilities(&parse_json(text)?, namespace)?)
    }

    /// Reads either format, told apart by the top-level key (`capabilities` or `tools`). The
    /// namespace applies to MCP tools only.
    pub fn from_any_json_str(
        text: &str,
        namespace: Option<&str>,
    ) -> Result<Catalog, LoadCatalogError> {
        Catalog::new(capabilities_from_any_json_str(text, namespace)?)
    }

    /// Like [`Catalog::from_any_json_str`], but reports every problem in the catalog rather
    /// than the first (for `corral catalog check`). Never returns an empty list.
    pub fn from_any_json_str_all_errors(
        text: &str,
        namespace: Option<&str>,
    ) -> Result<Catalog, Vec<LoadCatalogError>> {
        let capabilities =
            capabilities_from_any_json_str(text, namespace).map_err(|error| vec![error])?;
        Catalog::build(capabilities).map_err(|(first, rest)| {
            let mut all = vec![first];
            all.extend(rest);
            all
        })
    }

    /// The capabilities, in the order they were given.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// The capability with this id and its index (the index `validate_input` takes).
    pub fn get(&self, id: &str) -> Option<(usize, &Capability)> {
        let index = *self.index_by_id.get(id)?;
        Some((index, self.capabilities.get(index)?))
    }

    /// The capability bound at this JS path (`["github", "issues", "list"]`) and its index.
    pub fn get_by_path(&self, path: &[String]) -> Option<(usize, &Capability)> {
        let index = self.index_by_path.get_or_init(|| {
            self.capabilities
                .iter()
                .enumerate()
                .map(|(i, c)| (c.js_path.clone(), i))
                .collect()
        });
        let index = *index.get(path)?;
        Some((index, self.capabilities.get(index)?))
    }

    /// Number of capabilities.
    pub fn len(&self) -> usize {
        self.capabilities.len()
    }

    /// Whether the catalog has no capabilities.
    pub fn is_empty(&self) -> bool {
        self.capabilities.is_empty()
    }

    /// The catalog of just these capabilities (the authorized subset), in this catalog's order.
    /// Shares the compiled validators; nothing is recompiled.
    pub fn subset(&self, ids: &[&str]) -> Result<Catalog, LoadCatalogError> {
        let mut wanted = vec![false; self.capabilities.len()];
        for id in ids {
            let (index, _) = self
                .get(id)
                .ok_or_else(|| LoadCatalogError::UnknownCapability {
                    id: (*id).to_owned(),
                })?;
            wanted[index] = true;
        }
        let mut subset = Catalog {
            capabilities: Vec::new(),
            validators: Vec::new(),
            index_by_id: HashMap::new(),
            index_by_path: OnceLock::new(),
        };
        let chosen = self.capabilities.iter().zip(&self.validators);
        for ((capability, validator), _) in chosen.zip(&wanted).filter(|(_, keep)| **keep) {
            subset
                .index_by_id
                .insert(capability.id.clone(), subset.capabilities.len());
            subset.capabilities.push(capability.clone());
            subset.validators.push(Arc::clone(validator));
        }
        Ok(subset)
    }

    /// This catalog with `extra` capabilities appended (a host's built-ins, such as the chat
    /// runtime's `tools.$result`), checked like any capability: an id or a binding of `extra`
    /// that collides with one here is refused. The validators already compiled are shared;
    /// only `extra`'s are compiled.
    pub fn with_capabilities(&self, extra: Vec<Capability>) -> Result<Catalog, LoadCatalogError> {
        self.with_catalog(&Catalog::new(extra)?)
    }

    /// This catalog with the capabilities of `extra` appended, as
    /// [`Catalog::with_capabilities`] does, sharing `extra`'s compiled validators: a host that
    /// appends the same built-ins to every catalog compiles them once.
    pub fn with_catalog(&self, extra: &Catalog) -> Result<Catalog, LoadCatalogError> {
        let mut all = Catalog {
            capabilities: self.capabilities.clone(),
            validators: self.validators.clone(),
            index_by_id: self.index_by_id.clone(),
            index_by_path: OnceLock::new(),
        };
        for (capability, validator) in extra.capabilities.iter().zip(&extra.validators) {
            if let Some(&first) = all.index_by_id.get(&capability.id) {
                return Err(LoadCatalogError::DuplicateId {
                    id: capability.id.clone(),
                    first,
                    second: all.capabilities.len(),
                });
            }
            all.index_by_id
                .insert(capability.id.clone(), all.capabilities.len());
            all.capabilities.push(capability.clone());
            all.validators.push(Arc::clone(validator));
        }
        let bindable = vec![true; all.capabilities.len()];
        match check_bindings(&all.capabilities, &bindable)
            .into_iter()
            .next()
        {
            Some(collision) => Err(collision),
            None => Ok(all),
        }
    }

    /// Validates one call's input object (the object, not the 1-element array) against the
    /// capability's input schema with the cached compiled validator.
    pub fn validate_input(&self, index: usize, input: &Value) -> Result<(), ValidateInputError> {
        let (Some(capability), Some(validator)) =
            (self.capabilities.get(index), self.validators.get(index))
        else {
            return Err(ValidateInputError::UnknownCapability { index });
        };
        let validator = validator
            .get_or_init(|| compile_capability(capability).map_err(|error| error.to_string()));
        match validator {
            Ok(validator) => validate_with(validator, &capability.id, input),
            Err(message) => Err(ValidateInputError::UnusableSchema {
                capability: capability.id.clone(),
                message: message.clone(),
            }),
        }
    }

    /// Validates `input` and only then hands it to `invoke` (the backend call), so a backend
    /// never sees input the schema rejects. For an async backend, `invoke` returns the future,
    /// which is only created once validation has passed.
    pub fn call_validated<T>(
        &self,
        index: usize,
        input: Value,
        invoke: impl FnOnce(&Capability, Value) -> T,
    ) -> Result<T, ValidateInputError> {
        self.validate_input(index, &input)?;
        let capability = self
            .capabilities
            .get(index)
            .ok_or(ValidateInputError::UnknownCapability { index })?;
        Ok(invoke(capability, input))
    }

    #[cfg(test)]
    pub(crate) fn shares_validators_with(&self, other: &Catalog) -> bool {
        self.validators.iter().all(|mine| {
            other
                .validators
                .iter()
                .any(|theirs| Arc::ptr_eq(mine, theirs))
        })
    }
}

fn capabilities_from_any_json_str(
    text: &str,
    namespace: Option<&str>,
) -> Result<Vec<Capability>, LoadCatalogError> {
    let document = parse_json(text)?;
    if document.get("capabilities").is_some() {
        corral_capabilities(&document)
    } else if document.get("tools").is_some() {
        mcp_capabilities(&document, namespace.unwrap_or(""))
    } else {
        Err(LoadCatalogError::UnrecognizedFormat)
    }
}

fn corral_capabilities(document: &Value) -> Result<Vec<Capability>, LoadCatalogError> {
    let file: CatalogFile = deserialize(document, CatalogFormat::Corral, "capabilities", "id")?;
    Ok(file
        .capabilities
        .into_iter()
        .map(Capability::from)
        .collect())
}

fn mcp_capabilities(
    document: &Value,
    namespace: &str,
) -> Result<Vec<Capability>, LoadCatalogError> {
    check_namespace(namespace)?;
    let list: McpToolsList = deserialize(document, CatalogFormat::McpToolsList, "tools", "name")?;
    Ok(list
        .tools
        .into_iter()
        .map(|tool| tool.into_capability(namespace))
        .collect())
}

fn validate_with(
    validator: &jsonschema::Validator,
    capability: &str,
    input: &Value,
) -> Result<(), ValidateInputError> {
    let mut violations = Vec::new();
    let mut omitted = 0;
    for error in validator.iter_errors(input) {
        if violations.len() < MAX_REPORTED_VIOLATIONS {
            violations.push(InputViolation {
                pointer: error.instance_path.as_str().to_owned(),
                message: truncate_message(error.to_string()),
            });
        } else {
            omitted += 1;
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(ValidateInputError::Invalid {
            capability: capability.to_owned(),
            violations,
            omitted,
        })
    }
}

fn parse_json(text: &str) -> Result<Value, LoadCatalogError> {
    serde_json::from_str(text).map_err(|source| LoadCatalogError::ParseJson { source })
}

/// Deserializes `document`, turning serde's error into the JSON pointer of the offending value
/// and the id of the entry it is in (`list_key/N/id_key`), so a catalog author can find it.
fn deserialize<T: serde::de::DeserializeOwned>(
    document: &Value,
    format: CatalogFormat,
    list_key: &str,
    id_key: &str,
) -> Result<T, LoadCatalogError> {
    serde_path_to_error::deserialize(document).map_err(|error| {
        let mut pointer = String::new();
        let mut entry = None;
        for (depth, segment) in error.path().iter().enumerate() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    if depth == 1 {
                        entry = Some(*index);
                    }
                    pointer = schema::push_pointer(&pointer, &index.to_string());
                }
                serde_path_to_error::Segment::Map { key }
                | serde_path_to_error::Segment::Enum { variant: key } => {
                    pointer = schema::push_pointer(&pointer, key);
                }
                serde_path_to_error::Segment::Unknown => {
                    pointer = schema::push_pointer(&pointer, "?");
                }
            }
        }
        let capability = entry
            .and_then(|index| document.get(list_key)?.get(index)?.get(id_key)?.as_str())
            .map(str::to_owned);
        LoadCatalogError::InvalidDocument {
            format,
            capability,
            pointer,
            message: error.into_inner().to_string(),
        }
    })
}

fn check_namespace(namespace: &str) -> Result<(), LoadCatalogError> {
    let reason = if namespace.is_empty() {
        return Ok(());
    } else if namespace
        .split('.')
        .any(|part| js::invalid_part_reason(part).is_some())
    {
        Some("has an empty, `__proto__` or control-character part")
    } else if namespace.chars().any(char::is_whitespace) {
        Some("contains whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LoadCatalogError::InvalidNamespace {
            namespace: namespace.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn check_id(id: &str, position: usize) -> Result<(), LoadCatalogError> {
    let reason = if id.is_empty() {
        Some("it is empty")
    } else if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("it contains whitespace or control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LoadCatalogError::InvalidId {
            id: id.to_owned(),
            position,
            reason,
        }),
        None => Ok(()),
    }
}

fn check_js_path(capability: &Capability) -> Result<(), LoadCatalogError> {
    if capability.js_path.is_empty() {
        return Err(LoadCatalogError::InvalidJsPart {
            capability: capability.id.clone(),
            index: 0,
            part: String::new(),
            reason: "is missing: the JS path has no parts",
        });
    }
    for (index, part) in capability.js_path.iter().enumerate() {
        if let Some(reason) = js::invalid_part_reason(part) {
            return Err(LoadCatalogError::InvalidJsPart {
                capability: capability.id.clone(),
                index,
                part: part.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// A node of the `tools` object tree: a function or a namespace object.
#[derive(Default)]
struct BindingNode {
    /// The capability bound here as a function.
    function: Option<usize>,
    /// The first capability that needed this node as a namespace object.
    namespace_of: Option<usize>,
    children: BTreeMap<String, BindingNode>,
}

/// Each capability is bound at `tools.<js_path...>` and, when that differs, at `tools[<id>]`
/// as well; no binding may land on another or on a namespace object another needs. Capabilities
/// already refused (`bindable` false) are left out.
fn check_bindings(capabilities: &[Capability], bindable: &[bool]) -> Vec<LoadCatalogError> {
    let mut root = BindingNode::default();
    let mut errors = Vec::new();
    for (index, capability) in capabilities.iter().enumerate() {
        if !bindable.get(index).copied().unwrap_or(false) {
            continue;
        }
        let mut result = bind(&mut root, &capability.js_path, index, capabilities);
        if result.is_ok()
            && (capability.js_path.len() != 1 || capability.js_path[0] != capability.id)
        {
            result = bind(
                &mut root,
                std::slice::from_ref(&capability.id),
                index,
                capabilities,
            );
        }
        errors.extend(result.err());
    }
    errors
}

fn bind(
    root: &mut BindingNode,
    path: &[String],
    index: usize,
    capabilities: &[Capability],
) -> Result<(), LoadCatalogError> {
    let collision = |other: usize, depth: usize| LoadCatalogError::BindingCollision {
        first: capabilities[other].id.clone(),
        second: capabilities[index].id.clone(),
        binding: js::access_path(path[..depth].iter().map(String::as_str)),
    };
    let mut node = root;
    for (depth, part) in path.iter().enumerate() {
        node = node.children.entry(part.clone()).or_default();
        let is_last = depth + 1 == path.len();
        if let Some(other) = node.function {
            return Err(collision(other, depth + 1));
        }
        if is_last {
            if let Some(other) = node.namespace_of {
                return Err(collision(other, depth + 1));
            }
            node.function = Some(index);
        } else {
            node.namespace_of.get_or_insert(index);
        }
    }
    Ok(())
}

/// Checks both schemas of a capability and compiles the input schema.
fn compile_capability(capability: &Capability) -> Result<jsonschema::Validator, LoadCatalogError> {
    if capability.text_output && capability.output_schema.is_some() {
        return Err(LoadCatalogError::TextOutputWithSchema {
            capability: capability.id.clone(),
        });
    }
    if let Some(output_schema) = &capability.output_schema {
        check_schema(capability, SchemaRole::Output, output_schema)?;
        let invalid = |pointer: String, message: String| LoadCatalogError::InvalidSchema {
            capability: capability.id.clone(),
            role: SchemaRole::Output,
            pointer,
            message,
        };
        match jsonschema::meta::try_validate(output_schema) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(invalid(
                    error.instance_path.as_str().to_owned(),
                    error.to_string(),
                ));
            }
            Err(error) => return Err(invalid(String::new(), error.to_string())),
        }
    }
    check_schema(capability, SchemaRole::Input, &capability.input_schema)?;
    #[cfg(test)]
    tests::COMPILED_VALIDATORS.with(|count| count.set(count.get() + 1));
    jsonschema::options()
        .build(&capability.input_schema)
        .map_err(|error| LoadCatalogError::InvalidSchema {
            capability: capability.id.clone(),
            role: SchemaRole::Input,
            pointer: error.instance_path.as_str().to_owned(),
            message: error.to_string(),
        })
}

/// What corral checks itself before the `jsonschema` crate sees a schema, to name the capability
/// and pointer precisely: the schema is a schema, and every `$ref` is local and resolves.
fn check_schema(
    capability: &Capability,
    role: SchemaRole,
    schema: &Value,
) -> Result<(), LoadCatalogError> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(LoadCatalogError::InvalidSchema {
            capability: capability.id.clone(),
            role,
            pointer: String::new(),
            message: format!("a schema must be an object or a boolean, not {schema}"),
        });
    }
    schema::visit_subschemas(schema, "", &mut |subschema, pointer| {
        let Some(Value::String(reference)) = subschema.get("$ref") else {
            return Ok(());
        };
        let error_fields = || (capability.id.clone(), pointer.to_owned(), reference.clone());
        match schema::classify_reference(reference) {
            Reference::Remote => {
                let (capability, pointer, reference) = error_fields();
                Err(LoadCatalogError::RemoteReference {
                    capability,
                    role,
                    pointer,
                    reference,
                })
            }
            Reference::LocalPointer(target) if schema.pointer(&target).is_none() => {
                let (capability, pointer, reference) = error_fields();
                Err(LoadCatalogError::UnresolvedReference {
                    capability,
                    role,
                    pointer,
                    reference,
                })
            }
            Reference::LocalPointer(_) | Reference::LocalAnchor => Ok(()),
        }
    })?;
    if let Some((pointer, reference)) = schema::left_recursive_reference(schema) {
        return Err(LoadCatalogError::InvalidSchema {
            capability: capability.id.clone(),
            role,
            pointer,
            message: format!(
                "the reference {reference} leads back here without descending into a property \
                 or an item, so validating any value against it would never end"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use serde_json::json;

    use super::*;

    thread_local! {
        /// Input validators compiled on this thread (tests run one per thread).
        pub(crate) static COMPILED_VALIDATORS: Cell<usize> = const { Cell::new(0) };
    }

    #[test]
    fn references_that_loop_in_place_are_refused_and_recursive_trees_are_not() {
        let load = |schema: serde_json::Value| Catalog::new(vec![Capability::new("t.x", schema)]);
        for (schema, at) in [
            (
                json!({"anyOf": [{"$ref": "#"}, {"type": "number"}]}),
                "/anyOf/0",
            ),
            (
                json!({"type": "object", "allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"not": {"$ref": "#"}}}}),
                "/$defs/a/not",
            ),
            (
                json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}),
                "/$defs/",
            ),
            // What the fuzzer found (seed 1796132628909307461), trimmed: it overflowed the stack.
            (
                json!({"type": "object", "items": {"additionalProperties": true}, "anyOf": [{"$ref": "#"}, {"type": "number"}]}),
                "/anyOf/0",
            ),
        ] {
            match load(schema.clone()) {
                Err(LoadCatalogError::InvalidSchema {
                    pointer, message, ..
                }) => {
                    assert!(pointer.starts_with(at), "{schema}: {pointer}");
                    assert!(message.contains("never end"), "{message}");
                }
                other => panic!("{schema}: {other:?}"),
            }
        }
        // A tree: the reference descends into a property first, so every value is finite.
        let tree = json!({"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}});
        let catalog = load(tree).expect("a recursive tree loads");
        assert!(
            catalog
                .validate_input(
                    0,
                    &json!({"children": [{"children": []}], "next": {"next": null}})
                )
                .is_ok()
        );
    }

    #[test]
    fn added_capabilities_are_checked_against_the_catalog() -> Result<(), LoadCatalogError> {
        let catalog = Catalog::new(vec![Capability::new("a.b", json!({"type": "object"}))])?;
        let extra = Capability::new("$result", json!({"type": "object", "required": ["id"]}));
        let both = catalog.with_capabilities(vec![extra])?;
        let (index, _) = both.get("$result").expect("added");
        assert!(
            both.validate_input(index, &json!({})).is_err(),
            "its schema applies"
        );
        assert!(both.get("a.b").is_some());
        let clash = catalog.with_capabilities(vec![Capability::new("a.b", json!({}))]);
        assert!(
            matches!(clash, Err(LoadCatalogError::DuplicateId { .. })),
            "{clash:?}"
        );
        let onto = catalog.with_capabilities(vec![Capability::new("a", json!({}))]);
        assert!(
            matches!(onto, Err(LoadCatalogError::BindingCollision { .. })),
            "{onto:?}"
        );
        Ok(())
    }

    #[test]
    fn a_catalog_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Catalog>();
        assert_send_sync::<crate::Redactor>();
    }

    #[test]
    fn validators_are_compiled_once_per_catalog_not_per_call() -> Result<(), LoadCatalogError> {
        let before = COMPILED_VALIDATORS.with(Cell::get);
        let catalog = Catalog::new(vec![
            Capability::new("a.one", json!({"type": "object"})),
            Capability::new("a.two", json!({"type": "object", "required": ["x"]})),
        ])?;
        assert_eq!(COMPILED_VALIDATORS.with(Cell::get) - before, 2);
        for _ in 0..100 {
            assert!(catalog.validate_input(0, &json!({})).is_ok());
            assert!(catalog.validate_input(1, &json!({})).is_err());
        }
        let subset = catalog.subset(&["a.two"])?;
        assert!(subset.validate_input(0, &json!({"x": 1})).is_ok());
        assert_eq!(COMPILED_VALIDATORS.with(Cell::get) - before, 2);
        assert!(subset.shares_validators_with(&catalog));
        Ok(())
    }

    #[test]
    fn a_built_in_catalog_compiles_each_validator_on_first_use_and_once() {
        let text = json!({"capabilities": [
            {"id": "b.one", "input_schema": {"type": "object", "required": ["x"]}},
            {"id": "b.two", "input_schema": {"type": "object"}},
            {"id": "b.bad", "input_schema": {"type": "no-such-type"}},
        ]})
        .to_string();
        // The full check refuses the bad schema at load.
        assert!(matches!(
            Catalog::from_json_str(&text),
            Err(LoadCatalogError::InvalidSchema { .. })
        ));
        let before = COMPILED_VALIDATORS.with(Cell::get);
        let catalog = Catalog::built_in_from_json_str(&text).expect("cheap checks pass");
        assert_eq!(COMPILED_VALIDATORS.with(Cell::get) - before, 0);
        let subset = catalog.subset(&["b.one"]).expect("subset");
        for _ in 0..10 {
            assert!(subset.validate_input(0, &json!({"x": 1})).is_ok());
            assert!(catalog.validate_input(0, &json!({})).is_err());
        }
        // Compiled once, for the subset and its catalog together; b.two not at all.
        assert_eq!(COMPILED_VALIDATORS.with(Cell::get) - before, 1);
        match catalog.validate_input(2, &json!({})) {
            Err(error @ ValidateInputError::UnusableSchema { .. }) => {
                assert!(error.to_string().contains("b.bad"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        // Cheap checks still run at load.
        let duplicate = json!({"capabilities": [
            {"id": "b.one", "input_schema": {}}, {"id": "b.one", "input_schema": {}}
        ]});
        assert!(matches!(
            Catalog::built_in_from_json_str(&duplicate.to_string()),
            Err(LoadCatalogError::DuplicateId { .. })
        ));
    }
}
