//! The capability catalog: what a model may call, how it sees it, and what the host accepts.
//!
//! ```
//! use corral_catalog::{Catalog, render_typescript};
//!
//! let catalog = Catalog::from_json_str(r#"{"capabilities": [{
//!     "id": "github.issues.list",
//!     "description": "List the issues of a repository.",
//!     "input_schema": {
//!         "type": "object",
//!         "properties": {"repo": {"type": "string"}, "state": {"enum": ["open", "closed"]}},
//!         "required": ["repo"]
//!     }
//! }]}"#)?;
//! let (index, _) = catalog.get("github.issues.list").ok_or("missing")?;
//!
//! // The model sees TypeScript rendered from the catalog...
//! let typescript = render_typescript(&catalog)?;
//! assert!(typescript.contains("list(input: GithubIssuesListInput): Promise<unknown>;"));
//!
//! // ...and the host validates every call against the same schemas before a backend runs.
//! let input = serde_json::json!({"repo": "corral", "state": "closedd"});
//! let error = catalog.validate_input(index, &input).err().ok_or("accepted")?;
//! assert_eq!(error.violations()[0].pointer, "/state");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Core concepts:
//! - A [`Capability`] is one tool: a canonical id (`github.issues.list`), the JS path the guest
//!   binds it at (`tools.github.issues.list`), a description, input and output JSON Schemas,
//!   examples, whether it returns text, and whether it needs approval.
//! - A [`Catalog`] is a checked, immutable set of capabilities with their input validators
//!   compiled once. It is read from corral's catalog file or from an MCP server's `tools/list`
//!   result, and it is the single source for execution, TypeScript and prompt.
//! - [`render_typescript`] and [`render_prompt`] produce what the model sees; they fail, naming
//!   the capability and JSON pointer, on schemas they cannot render faithfully (cyclic
//!   references, for instance).
//! - Above a token budget, [`render_prompt_within`] lists a line per capability instead, and
//!   [`Catalog::search`] and [`Catalog::describe`] answer the model's lookups (discovery).
//! - [`Catalog::validate_input`] is the host's enforcement: every call's input is validated
//!   before the backend is invoked.
//! - A [`Redactor`] removes configured secrets and patterns from every backend result before it
//!   reaches the script, the model or events.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod capability;
mod catalog;
mod discovery;
mod js;
mod prompt;
mod redact;
mod schema;
mod typescript;

pub use capability::Capability;
pub use catalog::{
    Catalog, CatalogFormat, InputViolation, LoadCatalogError, MAX_REPORTED_VIOLATIONS,
    MAX_VIOLATION_MESSAGE_CHARS, ValidateInputError,
};
pub use discovery::{DEFAULT_SEARCH_RESULTS, DescribeError, MAX_SEARCH_RESULTS, did_you_mean};
pub use prompt::{DEFAULT_DISCOVERY_TOKENS, RenderedPrompt, render_prompt, render_prompt_within};
pub use redact::{BuildRedactorError, REDACTED, Redactor};
pub use schema::SchemaRole;
pub use typescript::{RenderSchemaError, check_renderable, render_typescript};
