//! RenderTypeScript and RenderPrompt on hand-written catalogs: the supported schema features,
//! naming, ordering, and the rendering errors a loadable catalog can still hit.

use corral_catalog::{
    Capability, Catalog, RenderSchemaError, SchemaRole, render_prompt, render_typescript,
};
use serde_json::json;

use crate::crate_dir;

pub(crate) fn features_catalog() -> anyhow::Result<Catalog> {
    let path = crate_dir().join("tests/all/fixtures/features.json");
    Ok(Catalog::from_json_str(&std::fs::read_to_string(path)?)?)
}

#[test]
fn features_rendering_matches_snapshot() -> anyhow::Result<()> {
    insta::assert_snapshot!("features", render_typescript(&features_catalog()?)?);
    Ok(())
}

#[test]
fn types_are_named_after_the_capability_and_methods_return_the_right_promise() -> anyhow::Result<()>
{
    let typescript = render_typescript(&features_catalog()?)?;
    for expected in [
        "type GithubIssuesListInput = {",
        "type GithubIssuesListOutput = {",
        "list(input: GithubIssuesListInput): Promise<GithubIssuesListOutput>;",
        // Text output is a string whatever it looks like.
        "\"read-text\"(input: FilesReadInput): Promise<string>;",
        // No output schema: the model is told nothing about the result.
        "counter(input: CounterInput): Promise<unknown>;",
        // Ids that do not start like an identifier still give valid type names.
        "render(input: T3dRenderInput): Promise<T3dRenderOutput>;",
        // A definition whose name would clash with the input type gets a suffix.
        "type ShapesDrawInput2 = string;",
        "label?: ShapesDrawInput2;",
    ] {
        assert!(
            typescript.contains(expected),
            "missing {expected:?} in\n{typescript}"
        );
    }
    Ok(())
}

#[test]
fn definitions_are_rendered_once_and_referenced_by_name() -> anyhow::Result<()> {
    let typescript = render_typescript(&features_catalog()?)?;
    assert_eq!(typescript.matches("type ShapesDrawPoint =").count(), 1);
    assert!(typescript.contains("origin?: ShapesDrawPoint;"));
    assert!(typescript.contains("points: ShapesDrawPoint[];"));
    assert_eq!(typescript.matches("type GithubIssuesListUser =").count(), 1);
    assert!(typescript.contains("assignee?: GithubIssuesListUser | null;"));
    Ok(())
}

#[test]
fn unrestricted_schemas_render_as_unknown() -> anyhow::Result<()> {
    let catalog = Catalog::new(vec![
        Capability::new("empty", json!({})),
        Capability::new("anything", json!(true)),
        Capability::new(
            "annotated",
            json!({"description": "no constraints", "title": "T"}),
        ),
    ])?;
    let typescript = render_typescript(&catalog)?;
    for name in ["EmptyInput", "AnythingInput", "AnnotatedInput"] {
        assert!(
            typescript.contains(&format!("type {name} = unknown;")),
            "{typescript}"
        );
    }
    Ok(())
}

#[test]
fn js_parts_that_are_not_identifiers_are_quoted() -> anyhow::Result<()> {
    let mut quoted = Capability::new("x", json!({"type": "object"}));
    quoted.js_path = vec!["my tools".into(), "say \"hi\"".into()];
    let typescript = render_typescript(&Catalog::new(vec![quoted])?)?;
    assert!(
        typescript.contains("  \"my tools\": {\n    \"say \\\"hi\\\"\"(input: XInput)"),
        "{typescript}"
    );
    Ok(())
}

#[test]
fn rendering_does_not_depend_on_catalog_order() -> anyhow::Result<()> {
    let catalog = features_catalog()?;
    let mut reversed = catalog.capabilities().to_vec();
    reversed.reverse();
    assert_eq!(
        render_typescript(&catalog)?,
        render_typescript(&Catalog::new(reversed)?)?
    );
    Ok(())
}

fn render_error(schema: serde_json::Value) -> anyhow::Result<RenderSchemaError> {
    let catalog = Catalog::new(vec![Capability::new("graph.walk", schema)])?;
    match render_typescript(&catalog) {
        Ok(typescript) => anyhow::bail!("rendered:\n{typescript}"),
        Err(error) => Ok(error),
    }
}

#[test]
fn cyclic_references_fail_naming_capability_and_pointer() -> anyhow::Result<()> {
    // Valid JSON Schema (the catalog loads and validates with it), but not renderable.
    let schema = json!({
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}
            }
        }
    });
    let error = render_error(schema)?;
    let message = error.to_string();
    assert_eq!(
        error,
        RenderSchemaError::CyclicReference {
            capability: "graph.walk".into(),
            role: SchemaRole::Input,
            pointer: "/$defs/Node/properties/children/items".into(),
            reference: "#/$defs/Node".into(),
        }
    );
    assert!(
        message.contains("graph.walk") && message.contains("/$defs/Node/properties/children/items")
    );

    let to_root = json!({"type": "object", "properties": {"again": {"$ref": "#"}}});
    assert!(matches!(
        render_error(to_root)?,
        RenderSchemaError::CyclicReference { pointer, .. } if pointer == "/properties/again"
    ));
    Ok(())
}

#[test]
fn cycles_in_output_schemas_are_reported_as_such() -> anyhow::Result<()> {
    let mut capability = Capability::new("tree.get", json!({"type": "object"}));
    capability.output_schema = Some(json!({
        "$ref": "#/definitions/Tree",
        "definitions": {"Tree": {"type": "object", "properties": {"sub": {"$ref": "#/definitions/Tree"}}}}
    }));
    let error = render_typescript(&Catalog::new(vec![capability])?).err();
    assert!(
        matches!(
            error,
            Some(RenderSchemaError::CyclicReference { role: SchemaRole::Output, ref capability, ref pointer, .. })
                if capability == "tree.get" && pointer == "/definitions/Tree/properties/sub"
        ),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn anchor_references_fail_naming_capability_and_pointer() -> anyhow::Result<()> {
    let schema = json!({
        "type": "object",
        "properties": {"a": {"$ref": "#item"}},
        "$defs": {"Item": {"$anchor": "item", "type": "string"}}
    });
    assert!(matches!(
        render_error(schema)?,
        RenderSchemaError::UnsupportedReference { capability, pointer, .. }
            if capability == "graph.walk" && pointer == "/properties/a"
    ));
    Ok(())
}

#[test]
fn references_to_other_local_places_render_as_named_types() -> anyhow::Result<()> {
    let schema = json!({
        "type": "object",
        "properties": {
            "from": {"type": "object", "properties": {"x": {"type": "number"}}},
            "to": {"$ref": "#/properties/from"}
        }
    });
    let catalog = Catalog::new(vec![Capability::new("move", schema)])?;
    let typescript = render_typescript(&catalog)?;
    assert!(
        typescript.contains("type MovePropertiesFrom = {"),
        "{typescript}"
    );
    assert!(
        typescript.contains("to?: MovePropertiesFrom;"),
        "{typescript}"
    );
    Ok(())
}

#[test]
fn prompt_wraps_the_typescript_and_reports_its_size() -> anyhow::Result<()> {
    let catalog = features_catalog()?;
    let typescript = render_typescript(&catalog)?;
    let prompt = render_prompt(&catalog)?;
    assert!(prompt.text.contains("`run_js`"));
    assert!(prompt.text.contains(&format!("```ts\n{typescript}```")));
    assert_eq!(
        prompt.approx_tokens,
        prompt.text.chars().count().div_ceil(4)
    );
    Ok(())
}

#[test]
fn prompt_fails_when_the_typescript_does() -> anyhow::Result<()> {
    let schema = json!({"type": "object", "properties": {"again": {"$ref": "#"}}});
    let catalog = Catalog::new(vec![Capability::new("loop", schema)])?;
    assert!(matches!(
        render_prompt(&catalog),
        Err(RenderSchemaError::CyclicReference { .. })
    ));
    Ok(())
}

#[test]
fn check_renderable_reports_every_capability_that_fails() -> anyhow::Result<()> {
    let cyclic = json!({"type": "object", "properties": {"again": {"$ref": "#"}}});
    let catalog = Catalog::new(vec![
        Capability::new("one", cyclic.clone()),
        Capability::new("fine", json!({"type": "object"})),
        Capability::new("two", cyclic),
    ])?;
    let failing: Vec<String> = corral_catalog::check_renderable(&catalog)
        .into_iter()
        .map(|error| match error {
            RenderSchemaError::CyclicReference { capability, .. } => capability,
            other => format!("unexpected {other}"),
        })
        .collect();
    assert_eq!(failing, ["one", "two"]);
    assert!(corral_catalog::check_renderable(&features_catalog()?).is_empty());
    Ok(())
}
