//! The HTTP layer's one error type and the one function that turns it into the JSON envelope
//! `{"status": "rejected", "code": C, "message": M}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use corral_store::{BoxError, StoreError};
use serde::Serialize;
use utoipa::ToSchema;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// 400 `invalid_request`: bad JSON, a schema violation, an unknown field, a bad cursor.
    #[error("{0}")]
    InvalidRequest(String),
    /// 401 `unauthorized`: no token, or a token the server does not know.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`: a known token outside its scope.
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: a known path with another method (the router adds the
    /// `Allow` header with the path's methods).
    #[error("method {0} is not allowed on this path (see the Allow header)")]
    MethodNotAllowed(String),
    /// 409 `conflict`.
    #[error("{0}")]
    Conflict(String),
    /// 413 `payload_too_large`: a body over 1 MiB.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 429 `too_many_requests`: over a per-client limit (a tenant's command rate, a token's
    /// event streams; see [`crate::limits`]), with `Retry-After` when a wait is known.
    #[error("{message}")]
    TooManyRequests {
        /// Which limit, and what to do.
        message: String,
        /// How long until the request would be accepted (the `Retry-After` header).
        retry_after: Option<std::time::Duration>,
    },
    /// 500 `internal_error`: logged with its cause, answered without it.
    #[error("internal error during {context}")]
    Internal {
        /// What the server was doing.
        context: &'static str,
        /// The cause (logged, never sent).
        #[source]
        source: BoxError,
    },
}

/// The error envelope every refused request gets.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Always `rejected`.
    #[schema(example = "rejected")]
    pub status: String,
    /// One of `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `conflict`, `payload_too_large`, `too_many_requests`,
    /// `internal_error`, `overloaded`.
    pub code: ErrorCode,
    /// What went wrong (never internal details).
    pub message: String,
}

/// The error codes of the wire contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400.
    InvalidRequest,
    /// 401.
    Unauthorized,
    /// 403.
    Forbidden,
    /// 404.
    NotFound,
    /// 405.
    MethodNotAllowed,
    /// 409.
    Conflict,
    /// 413.
    PayloadTooLarge,
    /// 429: a per-client limit (`Retry-After` says when to try again, if known).
    TooManyRequests,
    /// 500.
    InternalError,
    /// 503: the server is at its connection cap (`maxConnections`); sent before the request
    /// is read, so it belongs to no route.
    Overloaded,
}

impl ErrorCode {
    /// Every code, with its HTTP status.
    pub const ALL: &'static [(ErrorCode, u16)] = &[
        (ErrorCode::InvalidRequest, 400),
        (ErrorCode::Unauthorized, 401),
        (ErrorCode::Forbidden, 403),
        (ErrorCode::NotFound, 404),
        (ErrorCode::MethodNotAllowed, 405),
        (ErrorCode::Conflict, 409),
        (ErrorCode::PayloadTooLarge, 413),
        (ErrorCode::TooManyRequests, 429),
        (ErrorCode::InternalError, 500),
        (ErrorCode::Overloaded, 503),
    ];

    /// The text on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::Overloaded => "overloaded",
        }
    }

    /// The code of an HTTP status this API answers with, if it is an error status.
    pub fn of_status(status: u16) -> Option<ErrorCode> {
        ErrorCode::ALL
            .iter()
            .find(|(_, s)| *s == status)
            .map(|(code, _)| *code)
    }
}

impl ApiError {
    /// An internal error with its cause.
    pub fn internal(context: &'static str, source: impl Into<BoxError>) -> Self {
        ApiError::Internal {
            context,
            source: source.into(),
        }
    }

    /// The status and code this error is answered with.
    pub fn code(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::MethodNotAllowed(_) => {
                (StatusCode::METHOD_NOT_ALLOWED, ErrorCode::MethodNotAllowed)
            }
            ApiError::Conflict(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
            ApiError::PayloadTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge)
            }
            ApiError::TooManyRequests { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, ErrorCode::TooManyRequests)
            }
            ApiError::Internal { .. } => {
                (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::InternalError)
            }
        }
    }

    /// Maps a store error: records that are missing or in the wrong state are the caller's
    /// problem; everything else is internal.
    pub fn from_store(context: &'static str, error: StoreError) -> Self {
        match error {
            StoreError::NotFound { entity, .. } => {
                ApiError::NotFound(format!("{entity} not found"))
            }
            StoreError::Conflict { reason, .. } => ApiError::Conflict(reason),
            StoreError::StaleGeneration { entity, reason, .. } => {
                ApiError::Conflict(format!("the {entity} claim is stale: {reason}"))
            }
            StoreError::InvalidCursor { .. } => {
                ApiError::InvalidRequest("the cursor is beyond the newest event".to_owned())
            }
            StoreError::InvalidInput { what, reason } => {
                ApiError::InvalidRequest(format!("invalid {what}: {reason}"))
            }
            other => ApiError::internal(context, other),
        }
    }
}

/// The one function that turns an [`ApiError`] into a response.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.code();
        let message = match &self {
            ApiError::Internal { context, source } => {
                tracing::error!(context, error = %source, cause = ?source, "internal error");
                "the server failed to handle the request".to_owned()
            }
            other => other.to_string(),
        };
        let body = ErrorBody {
            status: "rejected".to_owned(),
            code,
            message,
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let ApiError::TooManyRequests {
            retry_after: Some(wait),
            ..
        } = &self
        {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                crate::limits::retry_after_header(*wait),
            );
        }
        response
    }
}
