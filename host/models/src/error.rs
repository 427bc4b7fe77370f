//! The one error type of a model call.

use std::time::Duration;

/// Why a model call failed. Messages never contain the API key (see [`crate::ApiKey`]).
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum ModelError {
    /// HTTP 429 (or a provider `rate_limit_error` event): too many requests or tokens.
    #[error("the provider is rate limiting us{}: {message}", retry_after_text(*.retry_after))]
    RateLimited {
        /// How long the provider asked us to wait (`retry-after-ms` or `retry-after`).
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// HTTP 5xx (including Anthropic's 529 "overloaded"), or a provider error event that says
    /// the fault is theirs.
    #[error("the provider failed (HTTP {status}): {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// HTTP 4xx other than 429: the request itself is wrong (bad key, unknown model, too long).
    #[error("the provider rejected the request (HTTP {status}): {message}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The stream ended (or the connection dropped) before the answer was complete.
    #[error("the model stream ended before the answer was complete: {message}")]
    Truncated {
        /// What was missing.
        message: String,
    },
    /// The provider sent something that is not its wire format (bad JSON in a chunk, tool-call
    /// arguments that are not JSON, an unknown event order).
    #[error("the provider sent a malformed stream: {message}")]
    Malformed {
        /// What was wrong.
        message: String,
    },
    /// The request never got an HTTP answer (connection refused, DNS, TLS, timeout).
    #[error("could not reach the provider: {message}")]
    Transport {
        /// The client's description.
        message: String,
    },
    /// The model is misconfigured (missing API key, unreadable scripted replies, bad URL).
    #[error("model configuration error: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
}

fn retry_after_text(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(wait) => format!(" (retry after {:.3}s)", wait.as_secs_f64()),
        None => String::new(),
    }
}

impl ModelError {
    /// Whether trying the same call again may succeed: rate limits, server errors, transport
    /// errors and truncated streams. Rejections, malformed streams and configuration errors
    /// would fail the same way again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ModelError::RateLimited { .. }
                | ModelError::Server { .. }
                | ModelError::Transport { .. }
                | ModelError::Truncated { .. }
        )
    }

    /// A stable machine-readable code for events and journals.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::RateLimited { .. } => "rate_limited",
            ModelError::Server { .. } => "server_error",
            ModelError::Rejected { .. } => "rejected",
            ModelError::Truncated { .. } => "truncated",
            ModelError::Malformed { .. } => "malformed",
            ModelError::Transport { .. } => "transport",
            ModelError::Config { .. } => "config",
        }
    }

    /// The same error with every occurrence of `secret` in its message replaced.
    pub(crate) fn redacted(self, key: &crate::ApiKey) -> Self {
        let r = |message: String| key.redact(&message);
        match self {
            ModelError::RateLimited {
                retry_after,
                message,
            } => ModelError::RateLimited {
                retry_after,
                message: r(message),
            },
            ModelError::Server { status, message } => ModelError::Server {
                status,
                message: r(message),
            },
            ModelError::Rejected { status, message } => ModelError::Rejected {
                status,
                message: r(message),
            },
            ModelError::Truncated { message } => ModelError::Truncated {
                message: r(message),
            },
            ModelError::Malformed { message } => ModelError::Malformed {
                message: r(message),
            },
            ModelError::Transport { message } => ModelError::Transport {
                message: r(message),
            },
            ModelError::Config { message } => ModelError::Config {
                message: r(message),
            },
        }
    }
}
