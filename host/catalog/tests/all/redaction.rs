//! Redaction of backend results: secrets and patterns never survive into what a script, the
//! model or an event sees.

use std::borrow::Cow;

use corral_catalog::{BuildRedactorError, REDACTED, Redactor};
use serde_json::json;

const TOKEN: &str = "ghp_0123456789abcdefABCDEF0123456789abcd";

fn redactor() -> anyhow::Result<Redactor> {
    Ok(Redactor::new(
        vec!["hunter2".into(), "s3cr3t-db-password".into()],
        vec![
            r"ghp_[A-Za-z0-9]{36}".into(),
            r"(?i)bearer\s+[a-z0-9._-]+".into(),
        ],
    )?)
}

#[test]
fn secrets_and_patterns_are_replaced_in_text() -> anyhow::Result<()> {
    let redactor = redactor()?;
    let text = format!("login hunter2 then {TOKEN}; header: Bearer abc.def-1");
    assert_eq!(
        redactor.redact_text(&text),
        "login [REDACTED] then [REDACTED]; header: [REDACTED]"
    );
    Ok(())
}

#[test]
fn text_without_secrets_is_borrowed_unchanged() -> anyhow::Result<()> {
    let redactor = redactor()?;
    assert!(matches!(
        redactor.redact_text("nothing to hide"),
        Cow::Borrowed("nothing to hide")
    ));
    Ok(())
}

#[test]
fn a_secret_containing_another_is_replaced_whole() -> anyhow::Result<()> {
    let redactor = Redactor::new(vec!["abc".into(), "abcdef".into()], Vec::new())?;
    assert_eq!(
        redactor.redact_text("xabcdefx abc"),
        "x[REDACTED]x [REDACTED]"
    );
    Ok(())
}

#[test]
fn a_backend_result_keeps_no_secret_in_values_keys_or_text() -> anyhow::Result<()> {
    let redactor = redactor()?;
    // What a backend might return: secrets in nested values, in keys, and inside text that
    // a text-output capability hands over as one string.
    let mut result = json!({
        "user": {"name": "ada", "password": "hunter2", "tokens": [TOKEN, {"nested": ["x hunter2 y"]}]},
        "hunter2": 1,
        "log": format!("connecting with s3cr3t-db-password and {TOKEN}"),
        "count": 3,
        "ok": true,
        "none": null
    });
    redactor.redact_json(&mut result);
    let expected = json!({
        "user": {"name": "ada", "password": REDACTED, "tokens": [REDACTED, {"nested": ["x [REDACTED] y"]}]},
        REDACTED: 1,
        "log": "connecting with [REDACTED] and [REDACTED]",
        "count": 3,
        "ok": true,
        "none": null
    });
    assert_eq!(result, expected);
    // Whatever the value is turned into next (JSON for the model, Debug in a log line).
    for view in [
        result.to_string(),
        format!("{result:?}"),
        format!("{result:#}"),
    ] {
        for secret in ["hunter2", "s3cr3t-db-password", TOKEN] {
            assert!(!view.contains(secret), "{secret} leaked into {view}");
        }
    }
    Ok(())
}

#[test]
fn keys_that_redact_to_the_same_text_keep_all_their_values() -> anyhow::Result<()> {
    let redactor = Redactor::new(vec!["alpha".into(), "beta".into()], Vec::new())?;
    let mut value = json!({"alpha": 1, "beta": 2});
    redactor.redact_json(&mut value);
    assert_eq!(value, json!({"[REDACTED]": 1, "[REDACTED] #2": 2}));
    // Even when the suffixed name is already taken by a key that needed no redaction.
    let mut value = json!({"alpha": 1, "beta": 2, "[REDACTED] #2": 3});
    redactor.redact_json(&mut value);
    let mut values: Vec<i64> = value
        .as_object()
        .map(|object| {
            object
                .values()
                .filter_map(serde_json::Value::as_i64)
                .collect()
        })
        .unwrap_or_default();
    values.sort_unstable();
    assert_eq!(values, [1, 2, 3]);
    Ok(())
}

#[test]
fn an_empty_redactor_changes_nothing() -> anyhow::Result<()> {
    assert!(Redactor::default().is_empty());
    let redactor = Redactor::new(Vec::new(), Vec::new())?;
    assert!(redactor.is_empty());
    let mut value = json!({"a": "hunter2"});
    redactor.redact_json(&mut value);
    assert_eq!(value, json!({"a": "hunter2"}));
    assert!(!self::redactor()?.is_empty());
    Ok(())
}

#[test]
fn bad_configuration_is_refused() {
    assert!(matches!(
        Redactor::new(vec!["ok".into(), String::new()], Vec::new()),
        Err(BuildRedactorError::EmptySecret { index: 1 })
    ));
    assert!(matches!(
        Redactor::new(Vec::new(), vec!["(unclosed".into()]),
        Err(BuildRedactorError::InvalidPattern { index: 0, .. })
    ));
    assert!(matches!(
        Redactor::new(Vec::new(), vec!["x+".into(), "a*".into()]),
        Err(BuildRedactorError::EmptyMatchPattern { index: 1 })
    ));
}

#[test]
fn debug_output_does_not_print_the_secrets() -> anyhow::Result<()> {
    let shown = format!("{:?}", redactor()?);
    assert!(
        !shown.contains("hunter2") && !shown.contains("ghp_"),
        "{shown}"
    );
    assert!(shown.contains("secrets: 2"), "{shown}");
    Ok(())
}
