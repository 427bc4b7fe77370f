//! RenderTypeScript: the catalog as TypeScript declarations, the model's whole view of it.
//!
//! Each capability gets an input type `<Id>Input` (and `<Id>Output` when it declares an output
//! schema), every local `$ref` target becomes one named type, and `declare const tools` nests a
//! method per capability under its JS path. Everything is emitted in a stable order.
//!
//! What a rendered type accepts, against what the validator ([`crate::Catalog::validate_input`])
//! accepts (checked by the `typescript_agrees` fuzz target in `tests/slow`, which judges JSON
//! instances against the rendered TypeScript by `tsc --strict`'s rules):
//!
//! - **Never narrower.** Every instance the validator accepts is assignable to the rendered
//!   type, so TypeScript never refuses a call the host would run. Three exceptions, on purpose
//!   or outside corral: (1) an object schema with declared properties that allows other keys
//!   without describing them (`additionalProperties` absent, `true` or `{}`) renders without
//!   an index signature, so `tsc`'s excess-property check flags undeclared keys
//!   written in an object literal, though the validator accepts them (it steers models to the
//!   declared keys); (2) a schema without `type` renders as the type its keywords imply
//!   (`properties` an object, `items` an array), where the validator would also accept the
//!   other JSON types; (3) the validator (jsonschema 0.33) takes a number within `f64::EPSILON`
//!   of a numeric `const` or `enum` value as equal to it, which a literal type does not.
//! - **Wider where TypeScript cannot say it.** `integer` is `number`; string lengths, patterns
//!   and formats, numeric bounds, item counts beyond a tuple's optional elements,
//!   `uniqueItems`, `not`, `if`/`then`/`else`, `propertyNames` and dependencies are not
//!   rendered; `oneOf` is a union (not exclusive); an index signature is the union of the
//!   declared properties' types and the extra keys' (`additionalProperties`,
//!   `patternProperties`, and `unknown` when keys no pattern matches are allowed); `nullable`
//!   adds `null`.
//! - **Exact otherwise.** For schemas made only of `type` (`string`, `number`, `boolean`,
//!   `null`, `array`, `object`), `const` and `enum` of scalars, `properties` with `required`
//!   and `additionalProperties: false`, `items`, `anyOf` of non-object members and boolean
//!   schemas, the rendered type, checked on an object literal in a call, accepts exactly the
//!   instances the validator accepts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::capability::Capability;
use crate::catalog::Catalog;
use crate::js;
use crate::schema::{self, Reference, SchemaRole, display_pointer, push_pointer};

/// Why the catalog could not be rendered. Every variant names the capability, which of its
/// schemas, and the JSON pointer within that schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenderSchemaError {
    /// A `$ref` that needs another document, or a named anchor, which the renderer does not
    /// follow.
    #[error(
        "capability {capability}: {role} at {}: unsupported reference {reference} ({reason})",
        display_pointer(pointer)
    )]
    UnsupportedReference {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the schema holding the `$ref`.
        pointer: String,
        /// The `$ref` value.
        reference: String,
        /// Why it is not supported.
        reason: &'static str,
    },
    /// A `$ref` that leads back to a schema it is part of; TypeScript aliases could express
    /// some of these, but the validator and the prompt budget are better served by refusing.
    #[error(
        "capability {capability}: {role} at {}: reference {reference} is cyclic",
        display_pointer(pointer)
    )]
    CyclicReference {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the schema holding the `$ref` that closes the cycle.
        pointer: String,
        /// The `$ref` value.
        reference: String,
    },
    /// A local `$ref` that points at nothing.
    #[error(
        "capability {capability}: {role} at {}: reference {reference} points at nothing",
        display_pointer(pointer)
    )]
    UnresolvedReference {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the schema holding the `$ref`.
        pointer: String,
        /// The `$ref` value.
        reference: String,
    },
    /// A keyword that shapes the type has a value of the wrong kind (`"type": 5`,
    /// `"properties": []`).
    #[error(
        "capability {capability}: {role} at {}: keyword {keyword} must be {expected}",
        display_pointer(pointer)
    )]
    MalformedKeyword {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the offending value.
        pointer: String,
        /// The keyword.
        keyword: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A `type` value JSON Schema does not define.
    #[error(
        "capability {capability}: {role} at {}: unknown type {type_name:?}",
        display_pointer(pointer)
    )]
    UnknownType {
        /// The capability.
        capability: String,
        /// Which schema.
        role: SchemaRole,
        /// JSON pointer to the `type` value.
        pointer: String,
        /// The unknown type name.
        type_name: String,
    },
}

/// Renders the catalog as TypeScript declarations: named input/output types and
/// `declare const tools: {...}`. The result compiles under `tsc --strict`.
pub fn render_typescript(catalog: &Catalog) -> Result<String, RenderSchemaError> {
    render_capabilities(catalog.capabilities())
}

/// Every rendering problem in the catalog rather than the first (for `corral catalog check`):
/// each capability is rendered on its own. Empty exactly when [`render_typescript`] succeeds.
pub fn check_renderable(catalog: &Catalog) -> Vec<RenderSchemaError> {
    catalog
        .capabilities()
        .iter()
        .filter_map(|capability| render_capabilities(std::slice::from_ref(capability)).err())
        .collect()
}

/// The header line of every rendering.
const HEADER: &str =
    "// The capabilities a script can call, as `tools`. Generated by corral from the catalog.\n";

/// Global TypeScript type names a generated name must not shadow.
const RESERVED_TYPE_NAMES: &[&str] = &[
    "Array",
    "ArrayLike",
    "Awaited",
    "BigInt",
    "Boolean",
    "Capitalize",
    "Date",
    "Error",
    "Exclude",
    "Extract",
    "Function",
    "InstanceType",
    "Iterable",
    "IterableIterator",
    "Iterator",
    "JSON",
    "Lowercase",
    "Map",
    "Math",
    "NonNullable",
    "Number",
    "Object",
    "Omit",
    "Parameters",
    "Partial",
    "Pick",
    "Promise",
    "PromiseLike",
    "Readonly",
    "ReadonlyArray",
    "ReadonlyMap",
    "ReadonlySet",
    "Record",
    "RegExp",
    "Required",
    "ReturnType",
    "Set",
    "String",
    "Symbol",
    "ThisType",
    "Uncapitalize",
    "Uppercase",
    "WeakMap",
    "WeakSet",
];

pub(crate) fn render_capabilities(
    capabilities: &[Capability],
) -> Result<String, RenderSchemaError> {
    let mut names = NameAllocator::default();
    let mut order: Vec<&Capability> = capabilities.iter().collect();
    order.sort_by(|a, b| a.id.cmp(&b.id));

    let mut declarations = String::new();
    let mut signatures = Vec::with_capacity(order.len());
    for capability in order {
        let base = pascal_case(&capability.id);
        let input_name = names.allocate(&format!("{base}Input"));
        let output_name = match (&capability.output_schema, capability.text_output) {
            (Some(_), false) => Some(names.allocate(&format!("{base}Output"))),
            _ => None,
        };
        let input = SchemaRenderer::new(
            capability,
            SchemaRole::Input,
            &capability.input_schema,
            &base,
        )
        .render_alias(&input_name, &mut names)?;
        declarations.push_str(&input);
        let return_type = match (&capability.output_schema, output_name) {
            (Some(output_schema), Some(output_name)) => {
                let output =
                    SchemaRenderer::new(capability, SchemaRole::Output, output_schema, &base)
                        .render_alias(&output_name, &mut names)?;
                declarations.push_str(&output);
                output_name
            }
            _ if capability.text_output => "string".to_owned(),
            _ => "unknown".to_owned(),
        };
        signatures.push((capability, input_name, return_type));
    }

    let mut tree = Namespace::default();
    for (capability, input_name, return_type) in signatures {
        tree.insert(&capability.js_path, capability, input_name, return_type);
    }
    let mut out = String::from(HEADER);
    out.push_str(&declarations);
    if !declarations.is_empty() {
        out.push('\n');
    }
    out.push_str("declare const tools: ");
    tree.render(0, &mut out);
    out.push_str(";\n");
    Ok(out)
}

/// Hands out unique type names in a stable order.
#[derive(Default)]
struct NameAllocator {
    used: HashSet<String>,
}

impl NameAllocator {
    fn allocate(&mut self, wanted: &str) -> String {
        let mut candidate = wanted.to_owned();
        let mut suffix = 2;
        while self.used.contains(&candidate) || RESERVED_TYPE_NAMES.contains(&candidate.as_str()) {
            candidate = format!("{wanted}{suffix}");
            suffix += 1;
        }
        self.used.insert(candidate.clone());
        candidate
    }
}

/// `github.issues.list` -> `GithubIssuesList`; `read_file` -> `ReadFile`.
fn pascal_case(text: &str) -> String {
    let mut out = String::new();
    for word in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if out.is_empty() {
        out.push_str("Capability");
    } else if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'T');
    }
    out
}

/// A TypeScript type, kept structured so unions and intersections flatten and get parentheses
/// only where precedence needs them.
#[derive(Debug, Clone, PartialEq)]
enum TsType {
    Unknown,
    Never,
    /// A keyword, name, literal, object, tuple or array type.
    Atom(String),
    /// Two or more members, none a union, `unknown` or `never`.
    Union(Vec<TsType>),
    /// Two or more parts, none an intersection or `unknown`.
    Intersection(Vec<TsType>),
}

impl TsType {
    fn atom(text: impl Into<String>) -> TsType {
        TsType::Atom(text.into())
    }

    fn union(members: Vec<TsType>) -> TsType {
        let mut flat: Vec<TsType> = Vec::new();
        for member in members {
            let parts = match member {
                TsType::Unknown => return TsType::Unknown,
                TsType::Never => continue,
                TsType::Union(parts) => parts,
                other => vec![other],
            };
            for part in parts {
                if !flat.contains(&part) {
                    flat.push(part);
                }
            }
        }
        match flat.len() {
            0 => TsType::Never,
            1 => flat.pop().unwrap_or(TsType::Never),
            _ => TsType::Union(flat),
        }
    }

    fn intersection(parts: Vec<TsType>) -> TsType {
        let mut flat: Vec<TsType> = Vec::new();
        for part in parts {
            let pieces = match part {
                TsType::Unknown => continue,
                TsType::Never => return TsType::Never,
                TsType::Intersection(pieces) => pieces,
                other => vec![other],
            };
            for piece in pieces {
                if !flat.contains(&piece) {
                    flat.push(piece);
                }
            }
        }
        match flat.len() {
            0 => TsType::Unknown,
            1 => flat.pop().unwrap_or(TsType::Unknown),
            _ => TsType::Intersection(flat),
        }
    }

    fn array_of(element: TsType) -> TsType {
        match element {
            TsType::Union(_) | TsType::Intersection(_) => {
                TsType::Atom(format!("({})[]", element.render()))
            }
            other => TsType::Atom(format!("{}[]", other.render())),
        }
    }

    fn render(&self) -> String {
        match self {
            TsType::Unknown => "unknown".to_owned(),
            TsType::Never => "never".to_owned(),
            TsType::Atom(text) => text.clone(),
            TsType::Union(members) => members
                .iter()
                .map(TsType::render)
                .collect::<Vec<_>>()
                .join(" | "),
            TsType::Intersection(parts) => parts
                .iter()
                .map(|part| match part {
                    TsType::Union(_) => format!("({})", part.render()),
                    other => other.render(),
                })
                .collect::<Vec<_>>()
                .join(" & "),
        }
    }
}

/// Renders one schema of one capability, with the named types its references need.
struct SchemaRenderer<'a> {
    capability: &'a Capability,
    role: SchemaRole,
    root: &'a Value,
    base_name: &'a str,
    /// Reference targets (decoded pointers) already given a name.
    named: HashMap<String, String>,
    /// Pointers being rendered, outermost first, to find cycles.
    in_progress: Vec<String>,
    /// `type` declarations for reference targets, in the order first referenced.
    definitions: String,
}

const SCHEMA: &str = "a schema (an object or a boolean)";
const TYPE_NAMES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];

impl<'a> SchemaRenderer<'a> {
    fn new(
        capability: &'a Capability,
        role: SchemaRole,
        root: &'a Value,
        base_name: &'a str,
    ) -> Self {
        SchemaRenderer {
            capability,
            role,
            root,
            base_name,
            named: HashMap::new(),
            in_progress: Vec::new(),
            definitions: String::new(),
        }
    }

    /// `type <name> = ...;` for the root schema, preceded by the types it references.
    fn render_alias(
        mut self,
        name: &str,
        names: &mut NameAllocator,
    ) -> Result<String, RenderSchemaError> {
        self.in_progress.push(String::new());
        let root_type = self.render_schema(self.root, "", 0, names)?;
        let mut out = std::mem::take(&mut self.definitions);
        writeln!(out, "type {name} = {};", root_type.render()).ok();
        Ok(out)
    }

    fn malformed(&self, pointer: &str, keyword: &str, expected: &'static str) -> RenderSchemaError {
        RenderSchemaError::MalformedKeyword {
            capability: self.capability.id.clone(),
            role: self.role,
            pointer: pointer.to_owned(),
            keyword: keyword.to_owned(),
            expected,
        }
    }

    fn render_schema(
        &mut self,
        schema: &Value,
        pointer: &str,
        indent: usize,
        names: &mut NameAllocator,
    ) -> Result<TsType, RenderSchemaError> {
        let object = match schema {
            Value::Bool(true) => return Ok(TsType::Unknown),
            Value::Bool(false) => return Ok(TsType::Never),
            Value::Object(object) => object,
            _ => {
                let keyword = pointer.rsplit('/').next().unwrap_or_default();
                return Err(self.malformed(pointer, &schema::unescape_token(keyword), SCHEMA));
            }
        };
        self.check_keyword_shapes(object, pointer)?;

        let nullable = object.get("nullable") == Some(&Value::Bool(true));
        let with_null = |ts: TsType| {
            if nullable {
                TsType::union(vec![ts, TsType::atom("null")])
            } else {
                ts
            }
        };
        if let Some(value) = object.get("const") {
            return Ok(with_null(TsType::atom(literal_type(value))));
        }
        if let Some(Value::Array(values)) = object.get("enum") {
            let members = values
                .iter()
                .map(|value| TsType::atom(literal_type(value)))
                .collect();
            return Ok(with_null(TsType::union(members)));
        }

        let mut parts = Vec::new();
        if let Some(Value::String(reference)) = object.get("$ref") {
            parts.push(self.render_reference(reference, pointer, names)?);
        }
        if let Some(base) = self.render_typed(object, pointer, indent, names)? {
            parts.push(base);
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(Value::Array(members)) = object.get(keyword) {
                let keyword_pointer = push_pointer(pointer, keyword);
                let mut rendered = Vec::with_capacity(members.len());
                for (index, member) in members.iter().enumerate() {
                    let member_pointer = push_pointer(&keyword_pointer, &index.to_string());
                    rendered.push(self.render_schema(member, &member_pointer, indent, names)?);
                }
                parts.push(TsType::union(rendered));
            }
        }
        if let Some(Value::Array(members)) = object.get("allOf") {
            let keyword_pointer = push_pointer(pointer, "allOf");
            for (index, member) in members.iter().enumerate() {
                let member_pointer = push_pointer(&keyword_pointer, &index.to_string());
                parts.push(self.render_schema(member, &member_pointer, indent, names)?);
            }
        }
        Ok(with_null(TsType::intersection(parts)))
    }

    /// Rejects type-bearing keywords whose values have the wrong shape, whether or not the
    /// rendering would use them, so the error does not depend on the other keywords present.
    fn check_keyword_shapes(
        &self,
        object: &Map<String, Value>,
        pointer: &str,
    ) -> Result<(), RenderSchemaError> {
        let is_schema = |value: &Value| value.is_object() || value.is_boolean();
        for (keyword, value) in object {
            let keyword_pointer = push_pointer(pointer, keyword);
            let expected = match keyword.as_str() {
                "type" => match value {
                    Value::String(name) => {
                        self.check_type_name(name, &keyword_pointer)?;
                        None
                    }
                    Value::Array(names) if !names.is_empty() => {
                        for (index, name) in names.iter().enumerate() {
                            let name_pointer = push_pointer(&keyword_pointer, &index.to_string());
                            match name {
                                Value::String(name) => self.check_type_name(name, &name_pointer)?,
                                _ => {
                                    return Err(self.malformed(
                                        &name_pointer,
                                        keyword,
                                        "a type name or a non-empty array of type names",
                                    ));
                                }
                            }
                        }
                        None
                    }
                    _ => Some("a type name or a non-empty array of type names"),
                },
                "properties" | "patternProperties" | "$defs" | "definitions" => match value {
                    Value::Object(map) => {
                        for (name, subschema) in map {
                            if !is_schema(subschema) {
                                return Err(self.malformed(
                                    &push_pointer(&keyword_pointer, name),
                                    keyword,
                                    SCHEMA,
                                ));
                            }
                        }
                        None
                    }
                    _ => Some("an object mapping names to schemas"),
                },
                "required" => match value {
                    Value::Array(names) if names.iter().all(Value::is_string) => None,
                    _ => Some("an array of property names"),
                },
                "items" => match value {
                    Value::Object(_) | Value::Bool(_) => None,
                    Value::Array(items) if items.iter().all(is_schema) => None,
                    _ => Some("a schema or an array of schemas"),
                },
                "prefixItems" => match value {
                    Value::Array(items) if items.iter().all(is_schema) => None,
                    _ => Some("an array of schemas"),
                },
                "anyOf" | "oneOf" | "allOf" => match value {
                    Value::Array(items) if !items.is_empty() && items.iter().all(is_schema) => None,
                    _ => Some("a non-empty array of schemas"),
                },
                "additionalProperties" | "additionalItems" => (!is_schema(value)).then_some(SCHEMA),
                "enum" => (!value.is_array()).then_some("an array of values"),
                "$ref" => (!value.is_string()).then_some("a reference string"),
                "nullable" => (!value.is_boolean()).then_some("a boolean"),
                "minItems" => (!value.is_u64()).then_some("a non-negative integer"),
                _ => None,
            };
            if let Some(expected) = expected {
                return Err(self.malformed(&keyword_pointer, keyword, expected));
            }
        }
        Ok(())
    }

    fn check_type_name(&self, name: &str, pointer: &str) -> Result<(), RenderSchemaError> {
        if TYPE_NAMES.contains(&name) {
            Ok(())
        } else {
            Err(RenderSchemaError::UnknownType {
                capability: self.capability.id.clone(),
                role: self.role,
                pointer: pointer.to_owned(),
                type_name: name.to_owned(),
            })
        }
    }

    /// A named type for the reference target, rendered the first time it is referenced.
    fn render_reference(
        &mut self,
        reference: &str,
        pointer: &str,
        names: &mut NameAllocator,
    ) -> Result<TsType, RenderSchemaError> {
        let unsupported = |reason| RenderSchemaError::UnsupportedReference {
            capability: self.capability.id.clone(),
            role: self.role,
            pointer: pointer.to_owned(),
            reference: reference.to_owned(),
            reason,
        };
        let target_pointer = match schema::classify_reference(reference) {
            Reference::LocalPointer(target) => target,
            Reference::LocalAnchor => return Err(unsupported("named anchors are not supported")),
            Reference::Remote => return Err(unsupported("it refers to another document")),
        };
        if self.in_progress.contains(&target_pointer) {
            return Err(RenderSchemaError::CyclicReference {
                capability: self.capability.id.clone(),
                role: self.role,
                pointer: pointer.to_owned(),
                reference: reference.to_owned(),
            });
        }
        if let Some(name) = self.named.get(&target_pointer) {
            return Ok(TsType::atom(name.clone()));
        }
        let Some(target) = self.root.pointer(&target_pointer) else {
            return Err(RenderSchemaError::UnresolvedReference {
                capability: self.capability.id.clone(),
                role: self.role,
                pointer: pointer.to_owned(),
                reference: reference.to_owned(),
            });
        };
        let local_name = match schema::definition_name(&target_pointer) {
            Some(definition) => pascal_case(&schema::unescape_token(definition)),
            None => pascal_case(&target_pointer),
        };
        let name = names.allocate(&format!("{}{local_name}", self.base_name));
        self.in_progress.push(target_pointer.clone());
        let rendered = self.render_schema(target, &target_pointer, 0, names)?;
        self.in_progress.pop();
        self.named.insert(target_pointer, name.clone());
        let doc = doc_comment(&annotation_lines(target), 0);
        writeln!(
            self.definitions,
            "{doc}type {name} = {};",
            rendered.render()
        )
        .ok();
        Ok(TsType::atom(name))
    }

    /// The type implied by `type`, or by object/array keywords when `type` is absent.
    fn render_typed(
        &mut self,
        object: &Map<String, Value>,
        pointer: &str,
        indent: usize,
        names: &mut NameAllocator,
    ) -> Result<Option<TsType>, RenderSchemaError> {
        let type_names: Vec<&str> = match object.get("type") {
            Some(Value::String(name)) => vec![name.as_str()],
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            _ => {
                let has = |keyword: &str| object.contains_key(keyword);
                if has("properties") || has("additionalProperties") || has("patternProperties") {
                    vec!["object"]
                } else if has("items") || has("prefixItems") {
                    vec!["array"]
                } else {
                    return Ok(None);
                }
            }
        };
        let mut members = Vec::with_capacity(type_names.len());
        for type_name in type_names {
            members.push(match type_name {
                "string" => TsType::atom("string"),
                "number" | "integer" => TsType::atom("number"),
                "boolean" => TsType::atom("boolean"),
                "null" => TsType::atom("null"),
                "object" => self.render_object(object, pointer, indent, names)?,
                "array" => self.render_array(object, pointer, indent, names)?,
                _ => TsType::Unknown,
            });
        }
        Ok(Some(TsType::union(members)))
    }

    fn render_object(
        &mut self,
        object: &Map<String, Value>,
        pointer: &str,
        indent: usize,
        names: &mut NameAllocator,
    ) -> Result<TsType, RenderSchemaError> {
        let empty = Map::new();
        let properties = match object.get("properties") {
            Some(Value::Object(properties)) => properties,
            _ => &empty,
        };
        let required: Vec<&str> = match object.get("required") {
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let inner = "  ".repeat(indent + 1);
        let mut body = String::new();
        let mut property_types = Vec::new();
        let mut any_optional = false;
        let properties_pointer = push_pointer(pointer, "properties");
        for (name, subschema) in properties {
            let property_pointer = push_pointer(&properties_pointer, name);
            let property_type =
                self.render_schema(subschema, &property_pointer, indent + 1, names)?;
            let is_required = required.contains(&name.as_str());
            any_optional |= !is_required;
            body.push_str(&doc_comment(&annotation_lines(subschema), indent + 1));
            let optional = if is_required { "" } else { "?" };
            writeln!(
                body,
                "{inner}{}{optional}: {};",
                js::property_name(name),
                property_type.render()
            )
            .ok();
            property_types.push(property_type);
        }
        // Required names without a property schema must be present with any value.
        for name in required
            .iter()
            .filter(|name| !properties.contains_key(**name))
        {
            writeln!(body, "{inner}{}: unknown;", js::property_name(name)).ok();
            property_types.push(TsType::Unknown);
        }

        let mut extra_types = Vec::new();
        if let Some(Value::Object(patterns)) = object.get("patternProperties") {
            let patterns_pointer = push_pointer(pointer, "patternProperties");
            for (pattern, subschema) in patterns {
                let pattern_pointer = push_pointer(&patterns_pointer, pattern);
                extra_types.push(self.render_schema(
                    subschema,
                    &pattern_pointer,
                    indent + 1,
                    names,
                )?);
            }
        }
        match object.get("additionalProperties") {
            Some(Value::Bool(false)) => {}
            Some(additional @ Value::Object(fields)) if !fields.is_empty() => {
                let additional_pointer = push_pointer(pointer, "additionalProperties");
                extra_types.push(self.render_schema(
                    additional,
                    &additional_pointer,
                    indent + 1,
                    names,
                )?);
            }
            // Absent, `true` or `{}`: extra keys are allowed but only worth declaring when
            // nothing else describes the object, or when `patternProperties` declare an index
            // signature: keys no pattern matches may then hold anything, and an index
            // signature of the patterns' types alone would refuse them.
            _ => {
                if (body.is_empty() && extra_types.is_empty()) || !extra_types.is_empty() {
                    extra_types.push(TsType::Unknown);
                }
            }
        }
        if !extra_types.is_empty() {
            // TypeScript requires every declared property to fit the index signature.
            let mut index_members = extra_types;
            if !property_types.is_empty() {
                index_members.extend(property_types);
                if any_optional {
                    index_members.push(TsType::atom("undefined"));
                }
            }
            let index_type = TsType::union(index_members);
            writeln!(body, "{inner}[key: string]: {};", index_type.render()).ok();
        }
        if body.is_empty() {
            // `{}` would admit any non-null value; this admits only objects without keys.
            return Ok(TsType::atom("Record<string, never>"));
        }
        let close = "  ".repeat(indent);
        Ok(TsType::Atom(format!("{{\n{body}{close}}}")))
    }

    fn render_array(
        &mut self,
        object: &Map<String, Value>,
        pointer: &str,
        indent: usize,
        names: &mut NameAllocator,
    ) -> Result<TsType, RenderSchemaError> {
        // 2020-12 spells tuples `prefixItems` + `items`; earlier drafts `items: [...]` +
        // `additionalItems`.
        let (tuple, tuple_keyword, rest, rest_keyword) =
            match (object.get("prefixItems"), object.get("items")) {
                (Some(Value::Array(prefix)), rest) => (Some(prefix), "prefixItems", rest, "items"),
                (None, Some(Value::Array(items))) => (
                    Some(items),
                    "items",
                    object.get("additionalItems"),
                    "additionalItems",
                ),
                (_, items) => (None, "", items, "items"),
            };
        let rest_type = match rest {
            Some(rest) => {
                self.render_schema(rest, &push_pointer(pointer, rest_keyword), indent, names)?
            }
            None => TsType::Unknown,
        };
        let Some(tuple) = tuple else {
            return Ok(TsType::array_of(rest_type));
        };
        let min_items = object.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let tuple_pointer = push_pointer(pointer, tuple_keyword);
        let mut elements = Vec::with_capacity(tuple.len() + 1);
        for (index, item) in tuple.iter().enumerate() {
            let item_type = self.render_schema(
                item,
                &push_pointer(&tuple_pointer, &index.to_string()),
                indent,
                names,
            )?;
            let is_required = (index as u64) < min_items;
            let text = match (&item_type, is_required) {
                (_, true) => item_type.render(),
                (TsType::Union(_) | TsType::Intersection(_), false) => {
                    format!("({})?", item_type.render())
                }
                (_, false) => format!("{}?", item_type.render()),
            };
            elements.push(text);
        }
        if rest_type != TsType::Never {
            elements.push(format!("...{}", TsType::array_of(rest_type).render()));
        }
        Ok(TsType::Atom(format!("[{}]", elements.join(", "))))
    }
}

/// A TypeScript literal type for a JSON value.
fn literal_type(value: &Value) -> String {
    match value {
        Value::String(text) => js::quote(text),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(literal_type).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(object) if object.is_empty() => "Record<string, never>".to_owned(),
        Value::Object(object) => {
            let fields: Vec<String> = object
                .iter()
                .map(|(key, item)| format!("{}: {}", js::property_name(key), literal_type(item)))
                .collect();
            format!("{{ {} }}", fields.join("; "))
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => value.to_string(),
    }
}

/// Longest default value quoted in a doc comment; longer ones are cut.
const MAX_DEFAULT_CHARS: usize = 80;

/// Doc-comment lines for a schema: its description, and the annotations a caller needs to
/// write a valid value that the type alone does not say.
fn annotation_lines(schema: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    let Value::Object(object) = schema else {
        return lines;
    };
    if let Some(Value::String(description)) = object.get("description") {
        lines.extend(
            description
                .trim()
                .lines()
                .map(|line| line.trim_end().to_owned()),
        );
    }
    if let Some(Value::String(format)) = object.get("format") {
        lines.push(format!("@format {format}"));
    }
    for keyword in [
        "minimum",
        "exclusiveMinimum",
        "maximum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
    ] {
        if let Some(value) = object.get(keyword).filter(|value| !value.is_boolean()) {
            let shown = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            lines.push(format!("@{keyword} {shown}"));
        }
    }
    if let Some(default) = object.get("default") {
        let mut shown = default.to_string();
        if let Some((cut, _)) = shown.char_indices().nth(MAX_DEFAULT_CHARS) {
            shown.truncate(cut);
            shown.push_str("...");
        }
        lines.push(format!("@default {shown}"));
    }
    if object.get("deprecated") == Some(&Value::Bool(true)) {
        lines.push("@deprecated".to_owned());
    }
    lines
}

/// A `/** ... */` block at `indent`, or nothing for no lines. `*/` inside the text is broken
/// up so it cannot end the comment early.
fn doc_comment(lines: &[String], indent: usize) -> String {
    let pad = "  ".repeat(indent);
    let safe: Vec<String> = lines
        .iter()
        .map(|line| line.replace("*/", "*\\/"))
        .collect();
    match safe.as_slice() {
        [] => String::new(),
        [line] if !line.is_empty() => format!("{pad}/** {line} */\n"),
        _ => {
            let mut out = format!("{pad}/**\n");
            for line in &safe {
                if line.is_empty() {
                    writeln!(out, "{pad} *").ok();
                } else {
                    writeln!(out, "{pad} * {line}").ok();
                }
            }
            writeln!(out, "{pad} */").ok();
            out
        }
    }
}

/// The `tools` object: namespaces by JS part, in sorted order.
#[derive(Default)]
struct Namespace<'a> {
    entries: BTreeMap<String, Binding<'a>>,
}

enum Binding<'a> {
    Method {
        capability: &'a Capability,
        input_name: String,
        return_type: String,
    },
    Namespace(Namespace<'a>),
}

impl<'a> Namespace<'a> {
    /// Adds a method; a catalog has already refused paths that collide, so a collision here
    /// keeps the first binding.
    fn insert(
        &mut self,
        path: &[String],
        capability: &'a Capability,
        input_name: String,
        return_type: String,
    ) {
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut namespace = self;
        for part in parents {
            let entry = namespace
                .entries
                .entry(part.clone())
                .or_insert_with(|| Binding::Namespace(Namespace::default()));
            match entry {
                Binding::Namespace(inner) => namespace = inner,
                Binding::Method { .. } => return,
            }
        }
        namespace
            .entries
            .entry(last.clone())
            .or_insert(Binding::Method {
                capability,
                input_name,
                return_type,
            });
    }

    fn render(&self, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent + 1);
        out.push_str("{\n");
        for (name, binding) in &self.entries {
            let property = js::property_name(name);
            match binding {
                Binding::Namespace(inner) => {
                    write!(out, "{pad}{property}: ").ok();
                    inner.render(indent + 1, out);
                    out.push_str(";\n");
                }
                Binding::Method {
                    capability,
                    input_name,
                    return_type,
                } => {
                    out.push_str(&doc_comment(&method_doc_lines(capability), indent + 1));
                    writeln!(
                        out,
                        "{pad}{property}(input: {input_name}): Promise<{return_type}>;"
                    )
                    .ok();
                }
            }
        }
        out.push_str(&"  ".repeat(indent));
        out.push('}');
    }
}

fn method_doc_lines(capability: &Capability) -> Vec<String> {
    let mut lines: Vec<String> = match &capability.description {
        Some(description) => description
            .trim()
            .lines()
            .map(|line| line.trim_end().to_owned())
            .collect(),
        None => Vec::new(),
    };
    if capability.needs_approval {
        if !lines.is_empty() {
            lines.push(String::new());
        }
        lines.push("Requires the user's approval.".to_owned());
    }
    let call = js::access_path(capability.js_path.iter().map(String::as_str));
    for example in &capability.examples {
        lines.push("@example".to_owned());
        lines.push(format!("await {call}({example});"));
    }
    lines
}

#[cfg(test)]
mod tests {
    //! Schemas a `Catalog` refuses before rendering (the `jsonschema` meta-schema check or
    //! corral's reference check) are rendered directly here, so the renderer's own refusals are
    //! tested too and do not silently depend on the loader.

    use serde_json::json;

    use super::*;

    fn render_input(schema: Value) -> Result<String, RenderSchemaError> {
        render_capabilities(&[Capability::new("github.issues.list", schema)])
    }

    fn malformed(pointer: &str, keyword: &str, expected: &'static str) -> RenderSchemaError {
        RenderSchemaError::MalformedKeyword {
            capability: "github.issues.list".into(),
            role: SchemaRole::Input,
            pointer: pointer.into(),
            keyword: keyword.into(),
            expected,
        }
    }

    #[test]
    fn malformed_type_bearing_keywords_name_capability_and_pointer() {
        let type_names = "a type name or a non-empty array of type names";
        let cases = [
            (
                json!({"properties": {"state": {"type": 5}}}),
                malformed("/properties/state/type", "type", type_names),
            ),
            (json!({"type": []}), malformed("/type", "type", type_names)),
            (
                json!({"type": ["string", 1]}),
                malformed("/type/1", "type", type_names),
            ),
            (
                json!({"type": "object", "properties": []}),
                malformed(
                    "/properties",
                    "properties",
                    "an object mapping names to schemas",
                ),
            ),
            (
                json!({"properties": {"a": 3}}),
                malformed("/properties/a", "properties", SCHEMA),
            ),
            (
                json!({"required": [1]}),
                malformed("/required", "required", "an array of property names"),
            ),
            (
                json!({"items": "x"}),
                malformed("/items", "items", "a schema or an array of schemas"),
            ),
            (
                json!({"prefixItems": {}}),
                malformed("/prefixItems", "prefixItems", "an array of schemas"),
            ),
            (
                json!({"anyOf": []}),
                malformed("/anyOf", "anyOf", "a non-empty array of schemas"),
            ),
            (
                json!({"allOf": [1]}),
                malformed("/allOf", "allOf", "a non-empty array of schemas"),
            ),
            (
                json!({"additionalProperties": "no"}),
                malformed("/additionalProperties", "additionalProperties", SCHEMA),
            ),
            (
                json!({"enum": "a"}),
                malformed("/enum", "enum", "an array of values"),
            ),
            (
                json!({"$ref": 1}),
                malformed("/$ref", "$ref", "a reference string"),
            ),
            (
                json!({"nullable": "yes"}),
                malformed("/nullable", "nullable", "a boolean"),
            ),
            (
                json!({"$defs": {"A": 1}}),
                malformed("/$defs/A", "$defs", SCHEMA),
            ),
            (json!(5), malformed("", "", SCHEMA)),
        ];
        for (schema, expected) in cases {
            assert_eq!(
                render_input(schema.clone()).err(),
                Some(expected),
                "{schema}"
            );
        }
    }

    #[test]
    fn unknown_type_names_name_capability_and_pointer() {
        let error = render_input(json!({"properties": {"tags": {"type": ["array", "lst"]}}})).err();
        assert_eq!(
            error,
            Some(RenderSchemaError::UnknownType {
                capability: "github.issues.list".into(),
                role: SchemaRole::Input,
                pointer: "/properties/tags/type/1".into(),
                type_name: "lst".into(),
            })
        );
    }

    #[test]
    fn remote_and_dangling_references_name_capability_and_pointer() {
        let remote =
            render_input(json!({"properties": {"a": {"$ref": "https://example.com/a.json"}}}));
        assert!(
            matches!(
                remote,
                Err(RenderSchemaError::UnsupportedReference { ref capability, ref pointer, .. })
                    if capability == "github.issues.list" && pointer == "/properties/a"
            ),
            "{remote:?}"
        );
        let dangling = render_input(json!({"items": {"$ref": "#/$defs/Nope"}}));
        assert!(
            matches!(
                dangling,
                Err(RenderSchemaError::UnresolvedReference { ref pointer, .. }) if pointer == "/items"
            ),
            "{dangling:?}"
        );
    }

    #[test]
    fn keywords_are_checked_even_where_the_type_ignores_them() {
        // A string schema never uses `properties`, but a malformed one is still an error.
        assert_eq!(
            render_input(json!({"type": "string", "properties": []})).err(),
            Some(malformed(
                "/properties",
                "properties",
                "an object mapping names to schemas"
            ))
        );
    }

    #[test]
    fn pascal_case_makes_identifiers() {
        assert_eq!(pascal_case("github.issues.list"), "GithubIssuesList");
        assert_eq!(pascal_case("fs.read_text-file"), "FsReadTextFile");
        assert_eq!(pascal_case("3d"), "T3d");
        assert_eq!(pascal_case("..."), "Capability");
    }

    #[test]
    fn generated_names_never_shadow_global_types() {
        let mut names = NameAllocator::default();
        assert_eq!(names.allocate("ReadonlyArray"), "ReadonlyArray2");
        assert_eq!(names.allocate("Thing"), "Thing");
        assert_eq!(names.allocate("Thing"), "Thing2");
    }
}
