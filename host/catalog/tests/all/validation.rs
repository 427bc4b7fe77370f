//! Input validation: what a script's rejected promise says, and that the backend is never
//! reached with invalid input.

use std::cell::Cell;

use corral_catalog::{
    Capability, Catalog, MAX_REPORTED_VIOLATIONS, MAX_VIOLATION_MESSAGE_CHARS, ValidateInputError,
};
use serde_json::{Value, json};

fn issues_catalog() -> anyhow::Result<(Catalog, usize)> {
    let catalog = Catalog::new(vec![Capability::new(
        "github.issues.list",
        json!({
            "type": "object",
            "properties": {
                "repo": {"type": "string"},
                "state": {"enum": ["open", "closed"]},
                "labels": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["repo"],
            "additionalProperties": false
        }),
    )])?;
    let (index, _) = catalog
        .get("github.issues.list")
        .ok_or(anyhow::anyhow!("missing"))?;
    Ok((catalog, index))
}

#[test]
fn valid_input_passes() -> anyhow::Result<()> {
    let (catalog, index) = issues_catalog()?;
    catalog.validate_input(
        index,
        &json!({"repo": "corral", "state": "open", "labels": ["bug"]}),
    )?;
    Ok(())
}

#[test]
fn rejection_lists_every_failing_pointer_and_why() -> anyhow::Result<()> {
    let (catalog, index) = issues_catalog()?;
    let input = json!({"state": "closedd", "labels": ["ok", 7], "extra": true});
    let error = catalog
        .validate_input(index, &input)
        .err()
        .ok_or(anyhow::anyhow!("accepted"))?;
    let mut pointers: Vec<&str> = error
        .violations()
        .iter()
        .map(|v| v.pointer.as_str())
        .collect();
    pointers.sort_unstable();
    // The root twice: `repo` is missing and `extra` is not allowed.
    assert_eq!(pointers, ["", "", "/labels/1", "/state"]);
    let message = error.to_string();
    assert!(
        message.starts_with("input for github.issues.list is invalid: "),
        "{message}"
    );
    for expected in [
        "/state: \"closedd\" is not one of \"open\" or \"closed\"",
        "/labels/1: 7 is not of type \"string\"",
        "(root): \"repo\" is a required property",
        "'extra' was unexpected",
    ] {
        assert!(
            message.contains(expected),
            "missing {expected:?} in {message}"
        );
    }
    Ok(())
}

#[test]
fn the_list_of_violations_is_capped_and_counts_the_rest() -> anyhow::Result<()> {
    let catalog = Catalog::new(vec![Capability::new(
        "bulk",
        json!({"type": "object", "additionalProperties": {"type": "integer"}}),
    )])?;
    let total = MAX_REPORTED_VIOLATIONS + 9;
    let input: serde_json::Map<String, Value> = (0..total)
        .map(|n| (format!("k{n}"), json!("not a number")))
        .collect();
    let error = catalog.validate_input(0, &Value::Object(input)).err();
    match &error {
        Some(ValidateInputError::Invalid {
            violations,
            omitted,
            ..
        }) => {
            assert_eq!(violations.len(), MAX_REPORTED_VIOLATIONS);
            assert_eq!(*omitted, 9);
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.ends_with("; and 9 more"), "{message}");
    Ok(())
}

#[test]
fn a_huge_offending_value_is_not_echoed_whole() -> anyhow::Result<()> {
    let (catalog, index) = issues_catalog()?;
    let huge = "x".repeat(100_000);
    let error = catalog
        .validate_input(index, &json!({"repo": "r", "state": huge}))
        .err()
        .ok_or(anyhow::anyhow!("accepted"))?;
    let message = &error.violations()[0].message;
    assert!(
        message.chars().count() <= MAX_VIOLATION_MESSAGE_CHARS + 3,
        "{} chars",
        message.len()
    );
    assert!(message.ends_with("..."));
    Ok(())
}

#[test]
fn an_index_outside_the_catalog_is_an_error_not_a_panic() -> anyhow::Result<()> {
    let (catalog, _) = issues_catalog()?;
    assert_eq!(
        catalog.validate_input(5, &json!({})),
        Err(ValidateInputError::UnknownCapability { index: 5 })
    );
    Ok(())
}

#[test]
fn invalid_input_never_reaches_the_backend() -> anyhow::Result<()> {
    let (catalog, index) = issues_catalog()?;
    let calls = Cell::new(0);
    let backend = |capability: &Capability, input: Value| {
        calls.set(calls.get() + 1);
        (capability.id.clone(), input)
    };

    let rejected = catalog.call_validated(index, json!({"state": "closedd"}), backend);
    assert!(matches!(rejected, Err(ValidateInputError::Invalid { .. })));
    assert_eq!(calls.get(), 0);

    let (id, input) = catalog.call_validated(index, json!({"repo": "corral"}), backend)?;
    assert_eq!(
        (id.as_str(), input),
        ("github.issues.list", json!({"repo": "corral"}))
    );
    assert_eq!(calls.get(), 1);
    Ok(())
}
