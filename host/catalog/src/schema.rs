//! JSON Schema plumbing shared by loading and rendering: JSON pointers, local references and the
//! positions of subschemas.

use std::fmt;

use serde_json::Value;

/// Which of a capability's two schemas an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaRole {
    /// The schema of the call's argument.
    Input,
    /// The schema of the call's result.
    Output,
}

impl fmt::Display for SchemaRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchemaRole::Input => "input schema",
            SchemaRole::Output => "output schema",
        })
    }
}

/// `pointer` extended by one reference token, escaped as RFC 6901 requires.
pub(crate) fn push_pointer(pointer: &str, token: &str) -> String {
    let escaped = token.replace('~', "~0").replace('/', "~1");
    format!("{pointer}/{escaped}")
}

/// Shows the root pointer `""` readably in messages.
pub(crate) fn display_pointer(pointer: &str) -> &str {
    if pointer.is_empty() {
        "(root)"
    } else {
        pointer
    }
}

/// Keywords whose value is one subschema.
const SINGLE_SUBSCHEMA_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];
/// Keywords whose value is an array of subschemas.
const SUBSCHEMA_ARRAY_KEYWORDS: &[&str] = &["anyOf", "oneOf", "allOf", "prefixItems"];
/// Keywords whose value maps names to subschemas.
const SUBSCHEMA_MAP_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Calls `visit` on `schema` and on every subschema in it, with its JSON pointer. Values in
/// non-schema positions (`const`, `enum`, `default`, `examples`) are never visited, so data that
/// happens to contain a `$ref` key is not mistaken for a reference.
pub(crate) fn visit_subschemas<E>(
    schema: &Value,
    pointer: &str,
    visit: &mut dyn FnMut(&Value, &str) -> Result<(), E>,
) -> Result<(), E> {
    visit(schema, pointer)?;
    let Value::Object(object) = schema else {
        return Ok(());
    };
    for (keyword, value) in object {
        let keyword_pointer = push_pointer(pointer, keyword);
        let keyword = keyword.as_str();
        let is_single = SINGLE_SUBSCHEMA_KEYWORDS.contains(&keyword);
        let is_array = SUBSCHEMA_ARRAY_KEYWORDS.contains(&keyword);
        let is_map = SUBSCHEMA_MAP_KEYWORDS.contains(&keyword);
        match value {
            // `items` is a schema in 2020-12 and a schema or an array of them before.
            Value::Object(_) | Value::Bool(_) if is_single || keyword == "items" => {
                visit_subschemas(value, &keyword_pointer, visit)?;
            }
            Value::Array(items) if is_array || keyword == "items" => {
                for (index, item) in items.iter().enumerate() {
                    let item_pointer = push_pointer(&keyword_pointer, &index.to_string());
                    visit_subschemas(item, &item_pointer, visit)?;
                }
            }
            Value::Object(map) if is_map => {
                for (name, subschema) in map {
                    // Draft-04 `dependencies` mixes schemas with arrays of property names.
                    if subschema.is_object() || subschema.is_boolean() {
                        let name_pointer = push_pointer(&keyword_pointer, name);
                        visit_subschemas(subschema, &name_pointer, visit)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Keywords that apply their subschemas to the instance itself, not to a property or an item of
/// it: a cycle of references through these alone never consumes any of the instance.
const IN_PLACE_SINGLE: &[&str] = &["not", "if", "then", "else"];
const IN_PLACE_ARRAYS: &[&str] = &["anyOf", "oneOf", "allOf"];
const IN_PLACE_MAPS: &[&str] = &["dependentSchemas", "dependencies"];

/// A `$ref` that closes a cycle of references through in-place keywords only, such as
/// `{"anyOf": [{"$ref": "#"}]}`: validating any instance against it would recurse forever (the
/// validator overflows the stack or never ends). Returns the pointer of the `$ref` and its
/// value. Cycles that descend into a property or an item (recursive trees) are fine.
pub(crate) fn left_recursive_reference(root: &Value) -> Option<(String, String)> {
    let mut nodes = Vec::new();
    let _ = visit_subschemas::<()>(root, "", &mut |_, pointer| {
        nodes.push(pointer.to_owned());
        Ok(())
    });
    // 1: on the current path of in-place edges; 2: explored, no cycle through it.
    let mut state: std::collections::HashMap<String, u8> = std::collections::HashMap::new();
    nodes
        .iter()
        .find_map(|node| in_place_cycle(root, node, &mut state))
}

fn in_place_cycle(
    root: &Value,
    pointer: &str,
    state: &mut std::collections::HashMap<String, u8>,
) -> Option<(String, String)> {
    if state.contains_key(pointer) {
        return None;
    }
    state.insert(pointer.to_owned(), 1);
    for (target, reference) in in_place_edges(root, pointer) {
        match state.get(&target) {
            Some(1) => {
                if let Some(reference) = reference {
                    return Some((pointer.to_owned(), reference));
                }
            }
            Some(_) => {}
            None => {
                if let Some(found) = in_place_cycle(root, &target, state) {
                    return Some(found);
                }
            }
        }
    }
    state.insert(pointer.to_owned(), 2);
    None
}

/// The schemas applied to the same instance as the one at `pointer`, each with the `$ref`
/// value that leads there (`None` for a subschema of an in-place keyword).
fn in_place_edges(root: &Value, pointer: &str) -> Vec<(String, Option<String>)> {
    let Some(Value::Object(object)) = root.pointer(pointer) else {
        return Vec::new();
    };
    let mut edges = Vec::new();
    for (keyword, value) in object {
        let keyword_pointer = push_pointer(pointer, keyword);
        match (keyword.as_str(), value) {
            ("$ref", Value::String(reference)) => {
                if let Reference::LocalPointer(target) = classify_reference(reference)
                    && root.pointer(&target).is_some()
                {
                    edges.push((target, Some(reference.clone())));
                }
            }
            (keyword, Value::Object(_)) if IN_PLACE_SINGLE.contains(&keyword) => {
                edges.push((keyword_pointer, None));
            }
            (keyword, Value::Array(items)) if IN_PLACE_ARRAYS.contains(&keyword) => {
                for index in 0..items.len() {
                    edges.push((push_pointer(&keyword_pointer, &index.to_string()), None));
                }
            }
            (keyword, Value::Object(map)) if IN_PLACE_MAPS.contains(&keyword) => {
                for (name, subschema) in map {
                    if subschema.is_object() {
                        edges.push((push_pointer(&keyword_pointer, name), None));
                    }
                }
            }
            _ => {}
        }
    }
    edges
}

/// How a `$ref` value is to be resolved.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reference {
    /// A JSON pointer into the same document (`#`, `#/$defs/Name`), decoded.
    LocalPointer(String),
    /// A named anchor in the same document (`#name`).
    LocalAnchor,
    /// Anything that would need another document.
    Remote,
}

pub(crate) fn classify_reference(reference: &str) -> Reference {
    let Some(fragment) = reference.strip_prefix('#') else {
        return Reference::Remote;
    };
    if fragment.is_empty() || fragment.starts_with('/') {
        Reference::LocalPointer(percent_decode(fragment))
    } else {
        Reference::LocalAnchor
    }
}

/// Decodes `%XX` escapes, which URI fragments use for characters a pointer may contain.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        let escape = (byte == b'%')
            .then(|| bytes.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(value) => {
                decoded.push(value);
                index += 3;
            }
            None => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The last token of a pointer such as `/$defs/Name`, unescaped; used to name defined types.
pub(crate) fn definition_name(pointer: &str) -> Option<&str> {
    let mut tokens = pointer.strip_prefix('/')?.split('/');
    let container = tokens.next()?;
    let name = tokens.next()?;
    let is_definition = container == "$defs" || container == "definitions";
    (is_definition && tokens.next().is_none()).then_some(name)
}

pub(crate) fn unescape_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_are_classified_and_fragments_decoded() {
        assert_eq!(
            classify_reference("#/$defs/a%20b"),
            Reference::LocalPointer("/$defs/a b".to_owned())
        );
        assert_eq!(
            classify_reference("#"),
            Reference::LocalPointer(String::new())
        );
        assert_eq!(classify_reference("#node"), Reference::LocalAnchor);
        assert_eq!(
            classify_reference("https://example.com/s.json"),
            Reference::Remote
        );
        assert_eq!(classify_reference("other.json#/a"), Reference::Remote);
    }

    #[test]
    fn data_positions_are_not_visited_as_schemas() {
        let schema = json!({
            "properties": {"a": {"const": {"$ref": "not-a-schema"}}},
            "items": [{"type": "string"}],
            "dependencies": {"a": ["b"], "c": {"type": "object"}}
        });
        let mut seen = Vec::new();
        visit_subschemas::<()>(&schema, "", &mut |_, pointer| {
            seen.push(pointer.to_owned());
            Ok(())
        })
        .ok();
        assert_eq!(seen, ["", "/properties/a", "/items/0", "/dependencies/c"]);
    }

    #[test]
    fn pointer_tokens_are_escaped() {
        assert_eq!(push_pointer("/properties", "a/b~c"), "/properties/a~1b~0c");
        assert_eq!(unescape_token("a~1b~0c"), "a/b~c");
        assert_eq!(definition_name("/$defs/Item"), Some("Item"));
        assert_eq!(definition_name("/definitions/Item"), Some("Item"));
        assert_eq!(definition_name("/properties/Item"), None);
        assert_eq!(definition_name("/$defs/Item/properties/x"), None);
    }
}
