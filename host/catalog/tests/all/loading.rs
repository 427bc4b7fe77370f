//! Reading catalogs in both formats, and every reason a catalog is refused.

use corral_catalog::{Capability, Catalog, LoadCatalogError, SchemaRole};
use serde_json::json;

fn corral_catalog(capabilities: serde_json::Value) -> Result<Catalog, LoadCatalogError> {
    Catalog::from_json_str(&json!({ "capabilities": capabilities }).to_string())
}

fn object_schema() -> serde_json::Value {
    json!({"type": "object"})
}

#[test]
fn corral_format_fills_defaults_and_honours_js_path() -> anyhow::Result<()> {
    let catalog = corral_catalog(json!([
        {"id": "github.issues.list", "input_schema": {"type": "object"}},
        {
            "id": "files.read",
            "js_path": ["fs", "read-file"],
            "description": "Read a file.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "output_schema": {"type": "object"},
            "examples": [{"path": "/a"}],
            "text_output": false,
            "needs_approval": true
        }
    ]))?;
    let (index, list) = catalog
        .get("github.issues.list")
        .ok_or(anyhow::anyhow!("missing"))?;
    assert_eq!(index, 0);
    assert_eq!(list.js_path, ["github", "issues", "list"]);
    assert_eq!(list.description, None);
    assert!(!list.text_output && !list.needs_approval && list.examples.is_empty());
    let (index, read) = catalog
        .get("files.read")
        .ok_or(anyhow::anyhow!("missing"))?;
    assert_eq!(index, 1);
    assert_eq!(read.js_path, ["fs", "read-file"]);
    assert!(read.needs_approval);
    assert_eq!(read.output_schema, Some(json!({"type": "object"})));
    assert_eq!(read.examples, [json!({"path": "/a"})]);
    Ok(())
}

#[test]
fn unknown_field_in_an_entry_is_named_with_its_pointer_and_capability() {
    let error = corral_catalog(json!([
        {"id": "a.ok", "input_schema": {}},
        {"id": "a.typo", "input_schema": {}, "needs_aproval": true}
    ]))
    .err();
    match error {
        Some(LoadCatalogError::InvalidDocument {
            capability,
            pointer,
            message,
            ..
        }) => {
            assert_eq!(capability.as_deref(), Some("a.typo"));
            assert_eq!(pointer, "/capabilities/1/needs_aproval");
            assert!(message.contains("needs_aproval"), "{message}");
        }
        other => panic!("expected InvalidDocument, got {other:?}"),
    }
}

#[test]
fn unknown_top_level_field_and_missing_input_schema_are_refused() {
    let text = json!({"capabilities": [], "version": 2}).to_string();
    match Catalog::from_json_str(&text).err() {
        Some(LoadCatalogError::InvalidDocument {
            pointer,
            capability: None,
            ..
        }) => {
            assert_eq!(pointer, "/version");
        }
        other => panic!("expected InvalidDocument, got {other:?}"),
    }
    let error = corral_catalog(json!([{"id": "a.b"}])).err();
    match &error {
        Some(LoadCatalogError::InvalidDocument {
            capability,
            pointer,
            message,
            ..
        }) => {
            assert_eq!(capability.as_deref(), Some("a.b"));
            assert_eq!(pointer, "/capabilities/0");
            assert!(message.contains("input_schema"), "{message}");
        }
        other => panic!("expected InvalidDocument, got {other:?}"),
    }
}

#[test]
fn text_that_is_not_json_or_neither_format_is_refused() {
    assert!(matches!(
        Catalog::from_json_str("{\"capabilities\": ["),
        Err(LoadCatalogError::ParseJson { .. })
    ));
    assert!(matches!(
        Catalog::from_any_json_str("{\"functions\": []}", None),
        Err(LoadCatalogError::UnrecognizedFormat)
    ));
}

const MCP_TOOLS: &str = r#"{
    "tools": [
        {"name": "read_file", "title": "Read", "description": "Read a file.",
         "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
         "annotations": {"readOnlyHint": true}, "execution": {"taskSupport": "forbidden"}},
        {"name": "get-env", "inputSchema": {"type": "object"},
         "outputSchema": {"type": "object", "additionalProperties": {"type": "string"}}}
    ],
    "nextCursor": null
}"#;

#[test]
fn mcp_tools_are_namespaced_and_keep_their_name_as_one_js_part() -> anyhow::Result<()> {
    let catalog = Catalog::from_mcp_tools_json(MCP_TOOLS, "fs.local")?;
    let ids: Vec<&str> = catalog
        .capabilities()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["fs.local.read_file", "fs.local.get-env"]);
    let (_, read) = catalog
        .get("fs.local.read_file")
        .ok_or(anyhow::anyhow!("missing"))?;
    assert_eq!(read.js_path, ["fs", "local", "read_file"]);
    assert_eq!(read.description.as_deref(), Some("Read a file."));
    let (_, env) = catalog
        .get("fs.local.get-env")
        .ok_or(anyhow::anyhow!("missing"))?;
    assert_eq!(env.js_path, ["fs", "local", "get-env"]);
    assert!(env.output_schema.is_some());

    let bare = Catalog::from_mcp_tools_json(MCP_TOOLS, "")?;
    assert!(bare.get("read_file").is_some());
    Ok(())
}

#[test]
fn any_format_is_detected_by_its_top_level_key() -> anyhow::Result<()> {
    let mcp = Catalog::from_any_json_str(MCP_TOOLS, Some("fs"))?;
    assert!(mcp.get("fs.read_file").is_some());
    let corral = Catalog::from_any_json_str(
        r#"{"capabilities": [{"id": "x.y", "input_schema": true}]}"#,
        Some("ignored"),
    )?;
    assert!(corral.get("x.y").is_some());
    Ok(())
}

#[test]
fn a_bad_mcp_namespace_is_refused() {
    for namespace in ["a..b", "__proto__", "has space"] {
        assert!(
            matches!(
                Catalog::from_mcp_tools_json(MCP_TOOLS, namespace),
                Err(LoadCatalogError::InvalidNamespace { .. })
            ),
            "{namespace}"
        );
    }
}

#[test]
fn mcp_tool_without_input_schema_is_named() {
    let text = r#"{"tools": [{"name": "ok", "inputSchema": {}}, {"name": "broken"}]}"#;
    match Catalog::from_mcp_tools_json(text, "srv").err() {
        Some(LoadCatalogError::InvalidDocument {
            capability,
            pointer,
            ..
        }) => {
            assert_eq!(capability.as_deref(), Some("broken"));
            assert_eq!(pointer, "/tools/1");
        }
        other => panic!("expected InvalidDocument, got {other:?}"),
    }
}

#[test]
fn duplicate_ids_are_refused_naming_both_positions() {
    let error = Catalog::new(vec![
        Capability::new("a.b", object_schema()),
        Capability::new("c", object_schema()),
        Capability::new("a.b", object_schema()),
    ])
    .err();
    match &error {
        Some(LoadCatalogError::DuplicateId { id, first, second }) => {
            assert_eq!((id.as_str(), *first, *second), ("a.b", 0, 2));
        }
        other => panic!("expected DuplicateId, got {other:?}"),
    }
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("a.b") && message.contains('0') && message.contains('2'),
        "{message}"
    );
}

#[test]
fn ids_must_be_non_empty_without_whitespace() {
    for id in ["", "a b", "a\tb"] {
        assert!(
            matches!(
                Catalog::new(vec![Capability::new(id, object_schema())]),
                Err(LoadCatalogError::InvalidId { .. })
            ),
            "{id:?}"
        );
    }
}

#[test]
fn bad_js_parts_are_refused_naming_capability_and_pointer() {
    let mut proto = Capability::new("evil", object_schema());
    proto.js_path = vec!["x".into(), "__proto__".into()];
    let mut empty_path = Capability::new("nothing", object_schema());
    empty_path.js_path = Vec::new();
    let cases = [
        (
            Capability::new("github..list", object_schema()),
            "github..list",
            1,
        ),
        (proto, "evil", 1),
        (empty_path, "nothing", 0),
    ];
    for (capability, expected_id, expected_index) in cases {
        let error = Catalog::new(vec![capability]).err();
        let message = error.as_ref().map(ToString::to_string).unwrap_or_default();
        match error {
            Some(LoadCatalogError::InvalidJsPart {
                capability, index, ..
            }) => {
                assert_eq!((capability.as_str(), index), (expected_id, expected_index));
                assert!(
                    message.contains(&format!("/js_path/{expected_index}")),
                    "{message}"
                );
            }
            other => panic!("expected InvalidJsPart, got {other:?}"),
        }
    }
}

fn collision(capabilities: Vec<Capability>) -> (String, String, String) {
    match Catalog::new(capabilities).err() {
        Some(LoadCatalogError::BindingCollision {
            first,
            second,
            binding,
        }) => (first, second, binding),
        other => panic!("expected BindingCollision, got {other:?}"),
    }
}

#[test]
fn colliding_bindings_are_refused_naming_both_capabilities() {
    // Same JS path through an override.
    let mut alias = Capability::new("gh.list_issues", object_schema());
    alias.js_path = vec!["github".into(), "issues".into(), "list".into()];
    let (first, second, binding) = collision(vec![
        Capability::new("github.issues.list", object_schema()),
        alias,
    ]);
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("github.issues.list", "gh.list_issues")
    );
    assert_eq!(binding, "tools.github.issues.list");

    // A function where another capability needs a namespace, in both orders.
    let (first, second, binding) = collision(vec![
        Capability::new("github.issues", object_schema()),
        Capability::new("github.issues.list", object_schema()),
    ]);
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("github.issues", "github.issues.list")
    );
    assert_eq!(binding, "tools.github.issues");
    let (first, second, binding) = collision(vec![
        Capability::new("github.issues.list", object_schema()),
        Capability::new("github.issues", object_schema()),
    ]);
    assert_eq!(
        (first.as_str(), second.as_str()),
        ("github.issues.list", "github.issues")
    );
    assert_eq!(binding, "tools.github.issues");

    // The canonical-id binding `tools["x"]` of one capability against another's JS path.
    let mut renamed = Capability::new("x", object_schema());
    renamed.js_path = vec!["y".into()];
    let (first, second, binding) =
        collision(vec![Capability::new("x.z", object_schema()), renamed]);
    assert_eq!((first.as_str(), second.as_str()), ("x.z", "x"));
    assert_eq!(binding, "tools.x");
}

#[test]
fn distinct_paths_sharing_namespaces_are_fine() -> anyhow::Result<()> {
    let catalog = Catalog::new(vec![
        Capability::new("github.issues.list", object_schema()),
        Capability::new("github.issues.get", object_schema()),
        Capability::new("github.pulls.list", object_schema()),
        Capability::new("echo", object_schema()),
    ])?;
    assert_eq!(catalog.len(), 4);
    Ok(())
}

fn schema_error(capability: Capability) -> LoadCatalogError {
    match Catalog::new(vec![capability]) {
        Ok(_) => panic!("the catalog was accepted"),
        Err(error) => error,
    }
}

#[test]
fn remote_references_are_refused_naming_capability_and_pointer() {
    let schema = json!({
        "type": "object",
        "properties": {"owner": {"$ref": "https://example.com/owner.json"}}
    });
    let error = schema_error(Capability::new("github.repo.get", schema));
    let message = error.to_string();
    match error {
        LoadCatalogError::RemoteReference {
            capability,
            role,
            pointer,
            reference,
        } => {
            assert_eq!(capability, "github.repo.get");
            assert_eq!(role, SchemaRole::Input);
            assert_eq!(pointer, "/properties/owner");
            assert_eq!(reference, "https://example.com/owner.json");
        }
        other => panic!("expected RemoteReference, got {other:?}"),
    }
    assert!(
        message.contains("github.repo.get") && message.contains("/properties/owner"),
        "{message}"
    );

    let mut with_output = Capability::new("x", object_schema());
    with_output.output_schema = Some(json!({"items": {"$ref": "other.json#/a"}}));
    match schema_error(with_output) {
        LoadCatalogError::RemoteReference {
            role: SchemaRole::Output,
            pointer,
            ..
        } => {
            assert_eq!(pointer, "/items");
        }
        other => panic!("expected RemoteReference, got {other:?}"),
    }
}

#[test]
fn references_to_nothing_are_refused() {
    let schema = json!({"properties": {"a": {"$ref": "#/$defs/Missing"}}});
    match schema_error(Capability::new("x.y", schema)) {
        LoadCatalogError::UnresolvedReference {
            capability,
            pointer,
            reference,
            ..
        } => {
            assert_eq!(
                (capability.as_str(), pointer.as_str()),
                ("x.y", "/properties/a")
            );
            assert_eq!(reference, "#/$defs/Missing");
        }
        other => panic!("expected UnresolvedReference, got {other:?}"),
    }
}

fn invalid_schema(schema: serde_json::Value) -> (String, SchemaRole, String, String) {
    match schema_error(Capability::new("github.issues.list", schema)) {
        LoadCatalogError::InvalidSchema {
            capability,
            role,
            pointer,
            message,
        } => (capability, role, pointer, message),
        other => panic!("expected InvalidSchema, got {other:?}"),
    }
}

#[test]
fn malformed_keywords_and_unknown_types_are_refused_naming_capability_and_pointer() {
    let cases = [
        (
            json!({"properties": {"state": {"type": 5}}}),
            "/properties/state/type",
        ),
        (json!({"type": "object", "properties": []}), "/properties"),
        (
            json!({"properties": {"state": {"type": "strng"}}}),
            "/properties/state/type",
        ),
        (
            json!({"properties": {"tags": {"type": ["array", "lst"]}}}),
            "/properties/tags/type",
        ),
        (json!({"required": "name"}), "/required"),
        (json!({"anyOf": {}}), "/anyOf"),
    ];
    for (schema, expected_pointer) in cases {
        let (capability, role, pointer, message) = invalid_schema(schema.clone());
        assert_eq!(capability, "github.issues.list");
        assert_eq!(role, SchemaRole::Input);
        assert!(
            pointer.starts_with(expected_pointer),
            "{schema}: pointer {pointer:?}, expected {expected_pointer:?} ({message})"
        );
    }
    let (_, _, pointer, _) = invalid_schema(json!(5));
    assert_eq!(pointer, "");
}

#[test]
fn a_malformed_output_schema_is_refused_as_such() {
    let mut capability = Capability::new("x.y", object_schema());
    capability.output_schema = Some(json!({"type": "object", "properties": {"n": {"type": 7}}}));
    match schema_error(capability) {
        LoadCatalogError::InvalidSchema { role, pointer, .. } => {
            assert_eq!(role, SchemaRole::Output);
            assert!(pointer.starts_with("/properties/n/type"), "{pointer}");
        }
        other => panic!("expected InvalidSchema, got {other:?}"),
    }
}

#[test]
fn examples_that_do_not_match_the_input_schema_are_refused() {
    let mut capability = Capability::new(
        "github.issues.list",
        json!({"type": "object", "properties": {"state": {"enum": ["open", "closed"]}}}),
    );
    capability.examples = vec![json!({"state": "open"}), json!({"state": "closedd"})];
    let error = schema_error(capability);
    let message = error.to_string();
    match error {
        LoadCatalogError::InvalidExample {
            capability,
            index,
            source,
        } => {
            assert_eq!((capability.as_str(), index), ("github.issues.list", 1));
            assert_eq!(source.violations()[0].pointer, "/state");
        }
        other => panic!("expected InvalidExample, got {other:?}"),
    }
    assert!(
        message.contains("/examples/1") && message.contains("/state"),
        "{message}"
    );
}

#[test]
fn text_output_cannot_declare_an_output_schema() {
    let mut capability = Capability::new("files.read", object_schema());
    capability.text_output = true;
    capability.output_schema = Some(json!({"type": "string"}));
    assert!(matches!(
        schema_error(capability),
        LoadCatalogError::TextOutputWithSchema { capability } if capability == "files.read"
    ));
}

#[test]
fn a_non_object_input_schema_is_allowed_and_validation_decides() -> anyhow::Result<()> {
    let catalog = Catalog::new(vec![Capability::new("count", json!({"type": "integer"}))])?;
    assert!(catalog.validate_input(0, &json!(3)).is_ok());
    assert!(catalog.validate_input(0, &json!({})).is_err());
    Ok(())
}

#[test]
fn subset_keeps_catalog_order_and_refuses_unknown_ids() -> anyhow::Result<()> {
    let catalog = Catalog::new(vec![
        Capability::new("a", object_schema()),
        Capability::new("b", json!({"type": "object", "required": ["x"]})),
        Capability::new("c", object_schema()),
    ])?;
    let subset = catalog.subset(&["c", "b"])?;
    let ids: Vec<&str> = subset
        .capabilities()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["b", "c"]);
    let (index, _) = subset.get("b").ok_or(anyhow::anyhow!("missing"))?;
    assert_eq!(index, 0);
    assert!(subset.validate_input(index, &json!({})).is_err());
    assert!(subset.get("a").is_none());
    assert!(matches!(
        catalog.subset(&["a", "nope"]),
        Err(LoadCatalogError::UnknownCapability { id }) if id == "nope"
    ));
    Ok(())
}

#[test]
fn all_errors_mode_reports_every_problem_not_just_the_first() {
    let text = json!({"capabilities": [
        {"id": "a.b", "input_schema": {"properties": {"x": {"type": 5}}}},
        {"id": "a.b", "input_schema": {}},
        {"id": "c", "input_schema": {"$ref": "https://example.com/c.json"}},
        {"id": "fine", "input_schema": {"type": "object"}}
    ]})
    .to_string();
    let errors = match Catalog::from_any_json_str_all_errors(&text, None) {
        Ok(_) => panic!("the catalog was accepted"),
        Err(errors) => errors,
    };
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, LoadCatalogError::DuplicateId { .. }))
    );
    assert!(errors.iter().any(
        |e| matches!(e, LoadCatalogError::InvalidSchema { capability, .. } if capability == "a.b")
    ));
    assert!(errors.iter().any(
        |e| matches!(e, LoadCatalogError::RemoteReference { capability, .. } if capability == "c")
    ));
    // The first-error constructor reports the first of them.
    assert!(matches!(
        Catalog::from_any_json_str(&text, None),
        Err(LoadCatalogError::DuplicateId { .. })
    ));

    let fine = json!({"capabilities": [{"id": "fine", "input_schema": {}}]}).to_string();
    assert!(Catalog::from_any_json_str_all_errors(&fine, None).is_ok());
    assert_eq!(
        Catalog::from_any_json_str_all_errors("[", None)
            .err()
            .map(|errors| errors.len()),
        Some(1)
    );
}
