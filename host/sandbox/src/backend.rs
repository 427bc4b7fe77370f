//! The host side of a capability call: the [`Backend`] trait and what it receives and returns.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Invoked for every capability call a script makes, after the input passed its schema.
///
/// Authorization is the backend's job on **every** invocation: the capability list given to a
/// session is only what is bound and shown, never a grant. Attribution (tenant, user, run)
/// comes from [`InvocationContext`], which the host fills in; nothing in
/// [`Invocation::input`] can change it.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs one call. The returned value is redacted before it reaches the script.
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError>;
}

/// One capability call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Invocation {
    /// Canonical id of the capability, such as `github.issues.list`.
    pub capability_id: String,
    /// Identifier of this call, unique within the host: `<session>:<script>:<call>`.
    pub tool_call_id: String,
    /// The script's arguments as a positional JSON array holding its one object argument.
    pub input: Value,
}

impl Invocation {
    /// The script's single object argument (the first element of [`Invocation::input`]).
    pub fn argument(&self) -> &Value {
        self.input.get(0).unwrap_or(&Value::Null)
    }
}

/// Who and what a session's calls are attributed to. Set by the host when it creates the
/// session; scripts cannot see or change it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvocationContext {
    /// The executor session's id; prefixes every `tool_call_id`.
    pub session_id: String,
    /// The tenant the session belongs to, if the host is multi-tenant.
    pub tenant_id: Option<String>,
    /// The authenticated user the session acts for.
    pub user_id: Option<String>,
    /// The run (chat turn, job) the session serves.
    pub run_id: Option<String>,
    /// Anything else the host's backends need for attribution.
    #[serde(default)]
    pub attributes: serde_json::Map<String, Value>,
}

/// A successful call result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The value handed to the script. For a `text_output` capability a string is handed over
    /// as a JavaScript string (anything else is serialized as JSON text first); for other
    /// capabilities the value arrives as parsed JSON.
    pub output: Value,
    /// Files or blobs produced by the call, as references into the host's storage; the model
    /// adapter resolves them later. They never enter the script's realm.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentRef>,
}

impl ToolResult {
    /// A result carrying only a value.
    pub fn new(output: Value) -> Self {
        ToolResult {
            output,
            attachments: Vec::new(),
        }
    }
}

/// A reference to an attachment kept in the host's storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachmentRef {
    /// Storage key or URI understood by the host's model adapter.
    pub reference: String,
    /// MIME type, such as `image/png`.
    pub media_type: String,
    /// Optional display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Why a backend did not produce a result. The message reaches the script (after redaction)
/// as the `message` of a rejected promise whose error `name` is `CapabilityError`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum InvokeCapabilityError {
    /// The caller may not use this capability (the backend's authorization said no).
    #[error("permission denied for {capability_id}: {reason}")]
    PermissionDenied {
        /// The capability refused.
        capability_id: String,
        /// Why, in words safe to show.
        reason: String,
    },
    /// The backend does not know the capability.
    #[error("unknown capability {capability_id}")]
    UnknownCapability {
        /// The capability asked for.
        capability_id: String,
    },
    /// The call does not complete in this run: the host holds it (it waits for a person's
    /// approval or an external executor). A held call is never delivered to the script; when
    /// the script has nothing left to wait on but held calls, it ends with
    /// [`crate::ExecError::Suspended`] listing them.
    #[error("{capability_id} is held: {reason}")]
    Held {
        /// The capability called.
        capability_id: String,
        /// Why the call is held, in words safe to show.
        reason: String,
    },
    /// The capability ran and failed.
    #[error("{capability_id} failed: {message}")]
    Failed {
        /// The capability that failed.
        capability_id: String,
        /// What went wrong, in words safe to show.
        message: String,
    },
}

#[async_trait::async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    async fn invoke(
        &self,
        context: &InvocationContext,
        invocation: Invocation,
    ) -> Result<ToolResult, InvokeCapabilityError> {
        (**self).invoke(context, invocation).await
    }
}
