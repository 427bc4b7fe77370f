//! Both HTTP adapters against recorded wire fixtures (see tests/fixtures/SOURCES.md), served by
//! a local server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{self, FixtureServer, Reply};
use anyhow::Result;
use corral_models::{
    ApiKey, Message, Model, ModelError, ModelEvent, ModelRequest, Provider, ProviderConfig,
    RetryPolicy, StopReason, ToolCall, ToolSpec, Usage, call_with_retry, collect,
};
use futures::StreamExt;
use serde_json::json;

const TEXT: &str =
    "The capital of France is Paris. It sits on the Seine and has about two million people.";
const KEY: &str = "sk-secret-0123456789abcdef";

fn dir(provider: Provider) -> &'static str {
    match provider {
        Provider::OpenAi => "openai",
        Provider::Anthropic => "anthropic",
    }
}

fn fx(provider: Provider, name: &str) -> String {
    format!("{}/{name}", dir(provider))
}

/// The recorded 5xx reply: OpenAI 500, Anthropic 529 (overloaded).
fn server_error_fixture(provider: Provider) -> String {
    fx(
        provider,
        if provider == Provider::OpenAi {
            "500.json"
        } else {
            "529.json"
        },
    )
}

fn model_for(provider: Provider, server: &FixtureServer) -> Result<Arc<dyn Model>> {
    let config = ProviderConfig {
        provider,
        model: if provider == Provider::OpenAi {
            "gpt-4o"
        } else {
            "claude-sonnet-4-5"
        }
        .to_owned(),
        base_url: Some(format!("{}/", server.url)),
        api_key: ApiKey::new(KEY),
    };
    Ok(config.build()?)
}

fn request() -> ModelRequest {
    ModelRequest {
        system: "You are terse.".to_owned(),
        messages: vec![Message::User {
            content: "What is the capital of France?".to_owned(),
        }],
        tools: vec![],
        max_output_tokens: 256,
        call_index: 0,
    }
}

fn fast_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_secs(5),
    }
}

const PROVIDERS: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

async fn events_of(model: &dyn Model) -> Result<Vec<ModelEvent>> {
    let stream = model.stream(request()).await?;
    let events: Vec<_> = stream.collect().await;
    Ok(events.into_iter().collect::<Result<Vec<_>, _>>()?)
}

#[tokio::test]
async fn complete_text_stream_yields_deltas_usage_and_done_in_order() -> Result<()> {
    for provider in PROVIDERS {
        let server = FixtureServer::start(vec![Reply::sse(&fx(provider, "text.sse"))?]).await?;
        let events = events_of(model_for(provider, &server)?.as_ref()).await?;
        let deltas: Vec<&str> = events
            .iter()
            .filter_map(|event| {
                if let ModelEvent::TextDelta(text) = event {
                    Some(text.as_str())
                } else {
                    None
                }
            })
            .collect();
        assert!(
            deltas.len() > 10,
            "{provider:?}: text arrives as many deltas, got {}",
            deltas.len()
        );
        assert_eq!(deltas.concat(), TEXT, "{provider:?}");
        let tail = &events[deltas.len()..];
        assert_eq!(
            tail,
            [
                ModelEvent::Usage(Usage {
                    input_tokens: 7,
                    output_tokens: 21
                }),
                ModelEvent::Done(StopReason::EndTurn)
            ],
            "{provider:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn tool_call_stream_assembles_parallel_calls_from_many_argument_deltas() -> Result<()> {
    for provider in PROVIDERS {
        let bytes = support::fixture(&fx(provider, "tool_calls.sse"))?;
        let argument_fragments = String::from_utf8_lossy(&bytes)
            .matches("arguments\":\"")
            .count()
            + String::from_utf8_lossy(&bytes)
                .matches("partial_json")
                .count();
        assert!(
            argument_fragments >= 10,
            "the fixture spreads arguments over many deltas"
        );
        let server =
            FixtureServer::start(vec![Reply::sse(&fx(provider, "tool_calls.sse"))?]).await?;
        let mut deltas = String::new();
        let stream = model_for(provider, &server)?.stream(request()).await?;
        let response = collect(stream, |delta| deltas.push_str(delta)).await?;
        assert_eq!(deltas, "", "{provider:?}");
        assert_eq!(response.stop_reason, StopReason::ToolUse, "{provider:?}");
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: 8,
                output_tokens: 32
            },
            "{provider:?}"
        );
        let calls: Vec<(&str, &serde_json::Value)> = response
            .tool_calls
            .iter()
            .map(|call| (call.name.as_str(), &call.arguments))
            .collect();
        assert_eq!(
            calls,
            [
                ("get_weather", &json!({"city": "Paris", "unit": "celsius"})),
                (
                    "run_js",
                    &json!({"code": "const [a, b] = await Promise.all([tools.x.a({}), tools.x.b({})]);\nreturn {a, b};"})
                ),
            ],
            "{provider:?}"
        );
        let prefix = if provider == Provider::OpenAi {
            "call_"
        } else {
            "toolu_"
        };
        assert!(
            response
                .tool_calls
                .iter()
                .all(|call| call.id.starts_with(prefix)),
            "{provider:?}: ids from the wire"
        );
        assert_ne!(response.tool_calls[0].id, response.tool_calls[1].id);
    }
    Ok(())
}

#[tokio::test]
async fn stream_ended_early_is_truncated_and_not_retried_after_text_was_shown() -> Result<()> {
    for provider in PROVIDERS {
        // llmock's `truncate` fault: the body ends cleanly after a few text chunks.
        let server = FixtureServer::start(vec![
            Reply::sse(&fx(provider, "truncated.sse"))?,
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;
        let mut shown = String::new();
        let error = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |delta| {
            shown.push_str(delta)
        })
        .await
        .expect_err("a truncated stream is an error");
        assert!(
            matches!(error, ModelError::Truncated { .. }),
            "{provider:?}: {error:?}"
        );
        assert_eq!(error.code(), "truncated");
        let recorded = if provider == Provider::OpenAi {
            "The capital of "
        } else {
            "The capital "
        };
        assert_eq!(shown, recorded, "{provider:?}: what was shown stays shown");
        assert_eq!(
            server.requests().len(),
            1,
            "{provider:?}: no retry after text was delivered"
        );
    }
    Ok(())
}

#[tokio::test]
async fn connection_dropped_before_any_text_is_retried_and_text_is_delivered_once() -> Result<()> {
    for provider in PROVIDERS {
        // The connection drops after the opening event(s), before any text.
        let cut = if provider == Provider::OpenAi { 1 } else { 2 };
        let server = FixtureServer::start(vec![
            Reply::sse_dropped_after(&fx(provider, "text.sse"), cut)?,
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;

        // Without retry the drop is a typed Truncated error.
        let dropped = FixtureServer::start(vec![Reply::sse_dropped_after(
            &fx(provider, "text.sse"),
            cut,
        )?])
        .await?;
        let error = collect(
            model_for(provider, &dropped)?.stream(request()).await?,
            |_| {},
        )
        .await
        .expect_err("dropped");
        assert!(
            matches!(error, ModelError::Truncated { .. }),
            "{provider:?}: {error:?}"
        );
        assert!(error.is_retryable());

        let mut shown = String::new();
        let response = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |delta| {
            shown.push_str(delta)
        })
        .await?;
        assert_eq!(response.text, TEXT, "{provider:?}");
        assert_eq!(shown, TEXT, "{provider:?}: nothing shown twice");
        assert_eq!(server.requests().len(), 2, "{provider:?}");
    }
    Ok(())
}

#[tokio::test]
async fn rate_limited_with_retry_after_is_retried_after_the_asked_wait() -> Result<()> {
    for provider in PROVIDERS {
        // The recorded 429 says `retry-after: 1` and `retry-after-ms: 1000`.
        let server = FixtureServer::start(vec![
            Reply::recorded_status(&fx(provider, "429.json"))?,
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;
        let started = Instant::now();
        let response = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |_| {}).await?;
        assert!(
            started.elapsed() >= Duration::from_millis(1000),
            "{provider:?}: waited as asked"
        );
        assert_eq!(response.text, TEXT);
        assert_eq!(server.requests().len(), 2);
    }
    Ok(())
}

#[tokio::test]
async fn rate_limits_exhaust_the_attempts_or_a_too_long_wait_fails_at_once() -> Result<()> {
    for provider in PROVIDERS {
        let limited = || -> Result<Reply> {
            Ok(Reply::recorded_status(&fx(provider, "429.json"))?.with_retry_after_ms(20))
        };
        let server = FixtureServer::start(vec![
            limited()?,
            limited()?,
            limited()?,
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;
        let error = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |_| {})
            .await
            .expect_err("exhausted");
        match &error {
            ModelError::RateLimited {
                retry_after,
                message,
            } => {
                assert_eq!(*retry_after, Some(Duration::from_millis(20)));
                assert!(message.contains("Rate limit exceeded"), "{message}");
            }
            other => panic!("{provider:?}: expected RateLimited, got {other:?}"),
        }
        assert_eq!(error.code(), "rate_limited");
        assert_eq!(
            server.requests().len(),
            3,
            "{provider:?}: max_attempts bounds the calls"
        );

        // retry-after of 1 s beyond a 100 ms cap: no wait, no second call.
        let server =
            FixtureServer::start(vec![Reply::recorded_status(&fx(provider, "429.json"))?]).await?;
        let model = model_for(provider, &server)?;
        let capped = RetryPolicy {
            max_delay: Duration::from_millis(100),
            ..fast_policy(3)
        };
        let error = call_with_retry(model.as_ref(), &request(), &capped, |_| {})
            .await
            .expect_err("capped");
        assert!(
            matches!(error, ModelError::RateLimited { retry_after: Some(wait), .. } if wait == Duration::from_secs(1))
        );
        assert_eq!(server.requests().len(), 1);
    }
    Ok(())
}

#[tokio::test]
async fn server_errors_are_typed_and_retried() -> Result<()> {
    for provider in PROVIDERS {
        let status = if provider == Provider::OpenAi {
            500
        } else {
            529
        };
        let server = FixtureServer::start(vec![
            Reply::recorded_status(&server_error_fixture(provider))?.with_retry_after_ms(10),
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;
        let response = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |_| {}).await?;
        assert_eq!(response.text, TEXT);

        let server = FixtureServer::start(vec![Reply::recorded_status(&server_error_fixture(
            provider,
        ))?])
        .await?;
        let model = model_for(provider, &server)?;
        let error = call_with_retry(model.as_ref(), &request(), &fast_policy(1), |_| {})
            .await
            .expect_err("5xx");
        assert!(
            matches!(&error, ModelError::Server { status: s, .. } if *s == status),
            "{provider:?}: {error:?}"
        );
        assert_eq!(error.code(), "server_error");
        assert!(error.is_retryable());
    }
    Ok(())
}

#[tokio::test]
async fn malformed_chunks_and_arguments_are_malformed_and_not_retried() -> Result<()> {
    for provider in PROVIDERS {
        for name in ["malformed.sse", "malformed_arguments.sse"] {
            let server = FixtureServer::start(vec![
                Reply::sse(&fx(provider, name))?,
                Reply::sse(&fx(provider, "text.sse"))?,
            ])
            .await?;
            let model = model_for(provider, &server)?;
            let error = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |_| {})
                .await
                .expect_err(name);
            assert!(
                matches!(error, ModelError::Malformed { .. }),
                "{provider:?} {name}: {error:?}"
            );
            assert!(!error.is_retryable());
            assert_eq!(server.requests().len(), 1, "{provider:?} {name}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_is_typed() -> Result<()> {
    let server = FixtureServer::start(vec![Reply::sse("anthropic/error_event.sse")?]).await?;
    let model = model_for(Provider::Anthropic, &server)?;
    let error = collect(model.stream(request()).await?, |_| {})
        .await
        .expect_err("error event");
    assert!(
        matches!(&error, ModelError::Server { status: 529, message } if message.contains("Overloaded")),
        "{error:?}"
    );
    Ok(())
}

#[tokio::test]
async fn rejected_requests_are_not_retried_and_transport_errors_are_typed() -> Result<()> {
    for provider in PROVIDERS {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"model: unknown model"}}"#;
        let server = FixtureServer::start(vec![
            Reply::json(400, body),
            Reply::sse(&fx(provider, "text.sse"))?,
        ])
        .await?;
        let model = model_for(provider, &server)?;
        let error = call_with_retry(model.as_ref(), &request(), &fast_policy(3), |_| {})
            .await
            .expect_err("400");
        assert!(
            matches!(&error, ModelError::Rejected { status: 400, message } if message == "invalid_request_error: model: unknown model"),
            "{error:?}"
        );
        assert_eq!(server.requests().len(), 1);
    }
    // Nothing listens on the port of a dropped listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = ProviderConfig {
        provider: Provider::OpenAi,
        model: "gpt-4o".to_owned(),
        base_url: Some(format!("http://127.0.0.1:{port}")),
        api_key: ApiKey::new(KEY),
    };
    let error = config
        .build()?
        .stream(request())
        .await
        .err()
        .expect("a refused connection is an error");
    assert!(matches!(error, ModelError::Transport { .. }), "{error:?}");
    assert!(error.is_retryable());
    Ok(())
}

fn conversation() -> ModelRequest {
    ModelRequest {
        system: "Be brief.".to_owned(),
        messages: vec![
            Message::User {
                content: "Weather in Paris, then run a script".to_owned(),
            },
            Message::Assistant {
                text: "Checking.".to_owned(),
                tool_calls: vec![
                    ToolCall {
                        id: "c1".to_owned(),
                        name: "get_weather".to_owned(),
                        arguments: json!({"city": "Paris"}),
                    },
                    ToolCall {
                        id: "c2".to_owned(),
                        name: "run_js".to_owned(),
                        arguments: json!({"code": "return 1"}),
                    },
                ],
            },
            Message::Tool {
                tool_call_id: "c1".to_owned(),
                content: "{\"temp\":20}".to_owned(),
                is_error: false,
            },
            Message::Tool {
                tool_call_id: "c2".to_owned(),
                content: "boom".to_owned(),
                is_error: true,
            },
            Message::User {
                content: "Thanks".to_owned(),
            },
        ],
        tools: vec![ToolSpec {
            name: "get_weather".to_owned(),
            description: "Weather for a city".to_owned(),
            input_schema: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }],
        max_output_tokens: 512,
        call_index: 3,
    }
}

#[tokio::test]
async fn openai_request_body_maps_the_conversation() -> Result<()> {
    let server = FixtureServer::start(vec![Reply::sse("openai/text.sse")?]).await?;
    let model = model_for(Provider::OpenAi, &server)?;
    collect(model.stream(conversation()).await?, |_| {}).await?;
    let sent = &server.requests()[0];
    assert_eq!(sent.request_line, "POST /chat/completions HTTP/1.1");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(
        sent.body,
        json!({
            "model": "gpt-4o",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_completion_tokens": 512,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris, then run a script"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "run_js", "arguments": "{\"code\":\"return 1\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\":20}"},
                {"role": "tool", "tool_call_id": "c2", "content": "Error: boom"},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }}],
        })
    );
    Ok(())
}

#[tokio::test]
async fn anthropic_request_body_maps_the_conversation_and_merges_tool_results() -> Result<()> {
    let server = FixtureServer::start(vec![Reply::sse("anthropic/text.sse")?]).await?;
    let model = model_for(Provider::Anthropic, &server)?;
    collect(model.stream(conversation()).await?, |_| {}).await?;
    let sent = &server.requests()[0];
    assert_eq!(sent.request_line, "POST /v1/messages HTTP/1.1");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 512,
            "stream": true,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris, then run a script"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "c2", "name": "run_js", "input": {"code": "return 1"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "{\"temp\":20}", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "boom", "is_error": true},
                    {"type": "text", "text": "Thanks"},
                ]},
            ],
            "tools": [{
                "name": "get_weather",
                "description": "Weather for a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }],
        })
    );
    Ok(())
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors_or_debug_output() -> Result<()> {
    for provider in PROVIDERS {
        // A proxy that echoes the key back in its error body.
        let echo = format!(
            r#"{{"error":{{"type":"authentication_error","message":"Incorrect API key provided: {KEY}."}}}}"#
        );
        let server = FixtureServer::start(vec![
            Reply::json(401, &echo),
            Reply::json(429, &echo),
            Reply::json(503, &echo),
        ])
        .await?;
        let model = model_for(provider, &server)?;
        for expected_code in ["rejected", "rate_limited", "server_error"] {
            let error = call_with_retry(model.as_ref(), &request(), &fast_policy(1), |_| {})
                .await
                .expect_err("echo");
            assert_eq!(error.code(), expected_code);
            for shown in [error.to_string(), format!("{error:?}")] {
                assert!(!shown.contains(KEY), "{provider:?}: key leaked in {shown}");
                assert!(
                    shown.contains("Incorrect API key provided: [redacted]."),
                    "{shown}"
                );
            }
        }
        // The key was really sent.
        let sent = &server.requests()[0];
        assert!(sent.headers.iter().any(|(_, value)| value.contains(KEY)));
        assert!(
            !format!("{model:?}").contains(KEY),
            "{provider:?}: model Debug"
        );
    }
    let config = ProviderConfig::from_lookup(Provider::OpenAi, "gpt-4o", |name| {
        (name == "OPENAI_API_KEY").then(|| KEY.to_owned())
    })?;
    assert!(!format!("{config:?}").contains(KEY));
    assert_eq!(format!("{}", config.api_key), "[redacted]");
    assert_eq!(format!("{:?}", config.api_key), "[redacted]");
    assert_eq!(config.api_key.expose_secret(), KEY);
    Ok(())
}
