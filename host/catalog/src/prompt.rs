//! RenderPrompt: the `run_js` instructions around the rendered TypeScript.

use crate::catalog::Catalog;
use crate::typescript::{RenderSchemaError, render_typescript};

/// Prompt text for the `run_js` tool and its rough size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The instructions followed by the TypeScript declarations in a fenced block.
    pub text: String,
    /// Characters divided by four, rounded up: a tokenizer-free estimate of the prompt's cost
    /// in a model's context.
    pub approx_tokens: usize,
}

const INSTRUCTIONS: &str = "\
To act, call the `run_js` tool with a JavaScript program. The program is the body of an async \
function and runs in a sandbox with no network, files, timers or modules: the `tools` object \
declared below is its only way out.

- Call a capability with exactly one object argument and await it: \
`const result = await tools.<name>({ ... });`
- Run independent calls together with `await Promise.all([...])`.
- `return` a JSON-serializable value; it is what you get back, so return only what you need.
- Each input is checked against its declared type before the capability runs; an invalid input \
rejects the promise with a message naming every failing field.
- `console.log(...)` and `log(level, message, fields)` record diagnostics; they call nothing.
- `user` is the current user (`{ id, email, displayName }`) or `null`, and is read-only.
- Data set on `globalThis` may still be there in a later `run_js` call of this run; do not \
rely on it afterwards.
";

/// Renders the `run_js` prompt for `catalog`: usage instructions and the TypeScript
/// declarations from [`render_typescript`], with its approximate token count.
pub fn render_prompt(catalog: &Catalog) -> Result<RenderedPrompt, RenderSchemaError> {
    let typescript = render_typescript(catalog)?;
    let text = format!("{INSTRUCTIONS}\n```ts\n{typescript}```\n");
    let approx_tokens = text.chars().count().div_ceil(4);
    Ok(RenderedPrompt {
        text,
        approx_tokens,
    })
}
