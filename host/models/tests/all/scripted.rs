//! The scripted model and provider configuration.

use anyhow::Result;
use corral_models::{
    Message, Model, ModelError, ModelEvent, ModelRequest, NO_MORE_REPLIES, Provider,
    ProviderConfig, RetryPolicy, ScriptedModel, StopReason, ToolCall, Usage, call_with_retry,
    model_from_spec,
};
use futures::StreamExt;
use serde_json::json;

const REPLIES: &str = r#"[
  {"text": "Let me run that."},
  {"toolCalls": [{"name": "run_js", "arguments": {"code": "return 1"}}, {"name": "run_js", "arguments": {"code": "return 2"}}]},
  {"text": "Done: 1 and 2.", "toolCalls": [{"name": "note", "arguments": {}}]}
]"#;

fn request(call_index: u64) -> ModelRequest {
    ModelRequest {
        system: "sys".to_owned(),
        messages: vec![Message::User {
            content: "hello there".to_owned(),
        }],
        tools: vec![],
        max_output_tokens: 100,
        call_index,
    }
}

async fn events(model: &ScriptedModel, call_index: u64) -> Result<Vec<ModelEvent>> {
    let stream = model.stream(request(call_index)).await?;
    Ok(stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?)
}

#[tokio::test]
async fn answers_the_reply_at_call_index() -> Result<()> {
    let model = ScriptedModel::from_json_str(REPLIES)?;
    assert_eq!(model.describe(), "scripted");

    let first = events(&model, 0).await?;
    assert_eq!(
        first[..4],
        [
            ModelEvent::TextDelta("Let ".into()),
            ModelEvent::TextDelta("me ".into()),
            ModelEvent::TextDelta("run ".into()),
            ModelEvent::TextDelta("that.".into())
        ]
    );
    assert!(matches!(first[4], ModelEvent::Usage(_)));
    assert_eq!(first[5], ModelEvent::Done(StopReason::EndTurn));
    assert_eq!(first.len(), 6);

    let second = call_with_retry(&model, &request(1), &RetryPolicy::default(), |_| {}).await?;
    assert_eq!(second.text, "");
    assert_eq!(
        second.tool_calls,
        [
            ToolCall {
                id: "call_1_0".into(),
                name: "run_js".into(),
                arguments: json!({"code": "return 1"})
            },
            ToolCall {
                id: "call_1_1".into(),
                name: "run_js".into(),
                arguments: json!({"code": "return 2"})
            },
        ]
    );
    assert_eq!(second.stop_reason, StopReason::ToolUse);

    // The same index gives the same answer: replay is exact.
    let third = call_with_retry(&model, &request(2), &RetryPolicy::default(), |_| {}).await?;
    assert_eq!(
        third,
        call_with_retry(&model, &request(2), &RetryPolicy::default(), |_| {}).await?
    );
    assert_eq!(third.text, "Done: 1 and 2.");
    assert_eq!(third.tool_calls[0].id, "call_2_0");
    // Usage: one token per four characters, rounded up. Output: "Done: 1 and 2." (14) + "note" (4) + "{}" (2).
    assert_eq!(third.usage.output_tokens, 5);
    let messages_json = serde_json::to_string(&request(2).messages)?;
    assert_eq!(
        third.usage.input_tokens,
        ((3 + messages_json.len() + 2) as u64).div_ceil(4)
    );
    // Tool calls come after the text, then usage, then Done.
    let order: Vec<&str> = events(&model, 2)
        .await?
        .iter()
        .map(|event| match event {
            ModelEvent::TextDelta(_) => "text",
            ModelEvent::ToolCall(_) => "tool",
            ModelEvent::Usage(_) => "usage",
            ModelEvent::Done(_) => "done",
        })
        .collect();
    assert_eq!(
        order,
        ["text", "text", "text", "text", "tool", "usage", "done"]
    );
    Ok(())
}

#[tokio::test]
async fn past_the_end_it_says_it_has_no_more_replies() -> Result<()> {
    let model = ScriptedModel::from_json_str(REPLIES)?;
    for index in [3, 1000, u64::MAX] {
        let response =
            call_with_retry(&model, &request(index), &RetryPolicy::default(), |_| {}).await?;
        assert_eq!(response.text, NO_MORE_REPLIES);
        assert_eq!(response.text, "(the scripted model has no more replies)");
        assert!(response.tool_calls.is_empty());
        assert_eq!(response.stop_reason, StopReason::EndTurn);
    }
    let empty = ScriptedModel::new(vec![]);
    let response = call_with_retry(&empty, &request(0), &RetryPolicy::default(), |_| {}).await?;
    assert_eq!(response.text, NO_MORE_REPLIES);
    assert_ne!(response.usage, Usage::default());
    Ok(())
}

#[test]
fn unknown_fields_and_empty_replies_are_rejected() {
    for (bad, needle) in [
        (
            r#"[{"text": "hi", "tool_calls": []}]"#,
            "unknown field `tool_calls`",
        ),
        (r#"[{"txt": "hi"}]"#, "unknown field `txt`"),
        (
            r#"[{"toolCalls": [{"name": "x", "args": {}}]}]"#,
            "unknown field `args`",
        ),
        (
            r#"[{"toolCalls": [{"arguments": {}}]}]"#,
            "missing field `name`",
        ),
        (
            r#"[{"text": "a"}, {}]"#,
            "reply 1 has neither text nor toolCalls",
        ),
        (r#"{"text": "not a list"}"#, "expected a sequence"),
    ] {
        match ScriptedModel::from_json_str(bad) {
            Err(ModelError::Config { message }) => {
                assert!(message.contains(needle), "{bad}: {message}")
            }
            other => panic!("{bad}: expected a Config error, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn from_file_and_model_spec() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("replies.json");
    std::fs::write(&path, REPLIES)?;
    let model = ScriptedModel::from_file(&path)?;
    assert_eq!(model.replies().len(), 3);
    let spec = model_from_spec(&format!("scripted:{}", path.display()))?;
    assert_eq!(spec.describe(), "scripted");
    let missing = ScriptedModel::from_file(dir.path().join("missing.json")).expect_err("missing");
    assert!(missing.to_string().contains("missing.json"), "{missing}");
    for bad in ["gpt-4o", "gemini:pro", "openai:"] {
        assert!(
            matches!(model_from_spec(bad), Err(ModelError::Config { .. })),
            "{bad}"
        );
    }
    Ok(())
}

#[test]
fn provider_config_reads_keys_and_base_urls_in_order() -> Result<()> {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let both = vars(&[
        ("CORRAL_OPENAI_API_KEY", "corral-key"),
        ("OPENAI_API_KEY", "plain-key"),
    ]);
    let config = ProviderConfig::from_lookup(Provider::OpenAi, "gpt-4o", both)?;
    assert_eq!(config.api_key.expose_secret(), "corral-key");
    assert_eq!(config.effective_base_url(), "https://api.openai.com/v1");

    let anthropic = vars(&[
        ("ANTHROPIC_API_KEY", "ant"),
        ("CORRAL_ANTHROPIC_BASE_URL", "http://127.0.0.1:9/"),
    ]);
    let config = ProviderConfig::from_lookup(Provider::Anthropic, "claude", anthropic)?;
    assert_eq!(config.api_key.expose_secret(), "ant");
    assert_eq!(config.effective_base_url(), "http://127.0.0.1:9");
    assert_eq!(config.build()?.describe(), "anthropic:claude");

    let error = ProviderConfig::from_lookup(
        Provider::Anthropic,
        "claude",
        vars(&[("OPENAI_API_KEY", "x")]),
    )
    .expect_err("no anthropic key");
    assert!(
        error
            .to_string()
            .contains("CORRAL_ANTHROPIC_API_KEY or ANTHROPIC_API_KEY"),
        "{error}"
    );

    let file = r#"{"provider": "openai", "model": "local", "baseUrl": "http://127.0.0.1:8000/v1", "apiKeyEnv": "MY_KEY"}"#;
    let config = ProviderConfig::from_json_str(file, vars(&[("MY_KEY", "mine")]))?;
    assert_eq!(
        (config.model.as_str(), config.api_key.expose_secret()),
        ("local", "mine")
    );
    assert_eq!(config.effective_base_url(), "http://127.0.0.1:8000/v1");
    let unknown = ProviderConfig::from_json_str(
        r#"{"provider": "openai", "model": "m", "apiKey": "sk"}"#,
        vars(&[]),
    );
    assert!(
        matches!(unknown, Err(ModelError::Config { message }) if message.contains("unknown field `apiKey`"))
    );
    Ok(())
}
