//! Compaction: keeping a request within the model's limits by summarizing older messages.
//!
//! The token estimate is deliberately tokenizer-free: the JSON text of the system prompt, the
//! messages and the tool declarations, divided by four. English text and JSON average a little
//! under four bytes per token on the models we target, so the estimate errs on the side of
//! compacting early; a request never needs an exact count, only to stay under the window with
//! room for the answer (`context_window - max_output`).

use corral_models::{Message, ModelRequest};

/// Estimated tokens of a request (see the module docs).
pub fn estimate_tokens(request: &ModelRequest) -> usize {
    let mut bytes = request.system.len();
    for message in &request.messages {
        bytes += serde_json::to_string(message).map_or(0, |t| t.len());
    }
    for tool in &request.tools {
        bytes += tool.name.len() + tool.description.len() + tool.input_schema.to_string().len();
    }
    bytes.div_ceil(4)
}

/// Where to cut `messages` so that the kept tail is about `keep_tokens` at most: the index of
/// the first kept message. Never cuts between an assistant's tool calls and their results (a
/// kept tail never starts with a tool result), and keeps at least the last message. `None`
/// when nothing can be summarized.
pub fn split_point(messages: &[Message], keep_tokens: usize) -> Option<usize> {
    let mut kept = 0usize;
    let mut split = messages.len();
    for (index, message) in messages.iter().enumerate().rev() {
        let size = serde_json::to_string(message)
            .map_or(0, |t| t.len())
            .div_ceil(4);
        if kept + size > keep_tokens && split < messages.len() {
            break;
        }
        kept += size;
        split = index;
    }
    // Move the cut back past tool results so each stays with the call that produced it.
    while split > 0 && split < messages.len() && matches!(messages[split], Message::Tool { .. }) {
        split -= 1;
    }
    (split > 0).then_some(split)
}

/// The request that asks the model for a summary of `messages`.
pub fn summary_request(
    messages: &[Message],
    max_output_tokens: u32,
    call_index: u64,
) -> ModelRequest {
    let mut transcript = String::new();
    for message in messages {
        match message {
            Message::User { content } => transcript.push_str(&format!("User: {content}\n")),
            Message::Assistant { text, tool_calls } => {
                transcript.push_str(&format!("Assistant: {text}\n"));
                for call in tool_calls {
                    transcript.push_str(&format!(
                        "Assistant called {} with {}\n",
                        call.name, call.arguments
                    ));
                }
            }
            Message::Tool {
                content, is_error, ..
            } => {
                let label = if *is_error {
                    "Tool error"
                } else {
                    "Tool result"
                };
                transcript.push_str(&format!("{label}: {content}\n"));
            }
        }
    }
    ModelRequest {
        system: "Summarize the conversation below for your own later use: keep every fact, \
                 decision, open question and tool result that may matter; be concise."
            .to_string(),
        messages: vec![Message::User {
            content: transcript,
        }],
        tools: Vec::new(),
        max_output_tokens,
        call_index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_models::ToolCall;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.to_string(),
        }
    }

    #[test]
    fn the_cut_never_separates_a_call_from_its_result() {
        let messages = vec![
            user(&"a".repeat(400)),
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "run_js".into(),
                    arguments: serde_json::json!({"code": "return 1"}),
                }],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                content: "x".repeat(400),
                is_error: false,
            },
            user("b"),
        ];
        // A budget that would keep only the tool result and the last message.
        let split = split_point(&messages, 130).expect("something to summarize");
        assert!(!matches!(messages[split], Message::Tool { .. }));
        assert_eq!(split, 1, "the call is kept with its result");
    }

    #[test]
    fn nothing_to_summarize_in_one_message() {
        assert_eq!(split_point(&[user("only")], 1), None);
    }
}
