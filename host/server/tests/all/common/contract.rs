//! Every response the black-box tests see is checked against the OpenAPI document the server
//! serves: its status must be documented for the operation, its JSON body must validate against
//! the documented schema (JSON Schema 2020-12, the dialect of OpenAPI 3.1), and a known path with
//! another method must be 405 with `Allow`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};

/// The document, as the server renders it.
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        serde_json::from_str(corral_server::openapi::document_json()).expect("the document is JSON")
    })
}

/// The path template of the document that `path` (without its query) matches.
pub fn template_of(path: &str) -> Option<&'static str> {
    let path = path.split('?').next().unwrap_or(path);
    let segments: Vec<&str> = path.split('/').collect();
    let paths = document()["paths"].as_object()?;
    paths
        .keys()
        .find(|template| {
            let parts: Vec<&str> = template.split('/').collect();
            parts.len() == segments.len()
                && parts.iter().zip(&segments).all(|(part, segment)| {
                    (part.starts_with('{') && !segment.is_empty()) || part == segment
                })
        })
        .map(String::as_str)
}

/// A validator for `schema` (a schema of the document, `$ref`s into its components).
fn validator(schema: &Value) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let key = schema.to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.lock().expect("cache").get(&key) {
        return Arc::clone(found);
    }
    let mut root = schema.clone();
    if let Some(object) = root.as_object_mut() {
        object.insert("components".to_owned(), document()["components"].clone());
    }
    let built = Arc::new(
        jsonschema::draft202012::options()
            .build(&root)
            .unwrap_or_else(|e| panic!("the document's schema {schema} does not compile: {e}")),
    );
    cache.lock().expect("cache").insert(key, Arc::clone(&built));
    built
}

/// Panics unless `instance` validates against `schema` (a schema of the document).
pub fn assert_valid(schema: &Value, instance: &Value, what: &str) {
    let validator = validator(schema);
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {instance} does not validate against {schema}:\n{}",
        errors.join("\n")
    );
}

/// The component schema `name` as a `$ref`.
pub fn component(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// Checks one response against the document.
pub fn check_response(
    method: &str,
    path: &str,
    status: u16,
    allow: Option<&str>,
    content_type: Option<&str>,
    text: &str,
) {
    let what = format!("{method} {path} -> {status}");
    let Some(template) = template_of(path) else {
        assert_eq!(
            status, 404,
            "{what}: a path outside the document must be 404"
        );
        let body: Value = serde_json::from_str(text).expect("JSON error body");
        assert_valid(&component("ErrorBody"), &body, &what);
        return;
    };
    let item = &document()["paths"][template];
    let operation = &item[method.to_lowercase()];
    if !operation.is_object() {
        assert_eq!(
            status, 405,
            "{what}: another method on a known path must be 405"
        );
        let allow = allow.unwrap_or_else(|| panic!("{what}: 405 without Allow"));
        for (name, _) in item.as_object().expect("path item") {
            if matches!(name.as_str(), "get" | "put" | "post" | "delete" | "patch") {
                assert!(
                    allow.contains(&name.to_uppercase()),
                    "{what}: Allow {allow:?} lacks {name}"
                );
            }
        }
        let body: Value = serde_json::from_str(text).expect("JSON error body");
        assert_valid(&component("ErrorBody"), &body, &what);
        assert_eq!(body["code"], "method_not_allowed", "{what}");
        return;
    }
    let response = &operation["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{what}: status {status} is not documented for {method} {template}: {text}"
    );
    let content_type = content_type.unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let Some(declared) = response["content"].as_object() else {
        assert!(text.is_empty(), "{what}: a body where none is documented");
        return;
    };
    let content = declared.get(media).unwrap_or_else(|| {
        panic!(
            "{what}: content type {content_type:?} is not documented (only {:?})",
            declared.keys().collect::<Vec<_>>()
        )
    });
    if media == "application/json" {
        let body: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{what}: the body is not JSON ({e}): {text}"));
        assert_valid(&content["schema"], &body, &what);
    }
}
