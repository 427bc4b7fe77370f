//! RenderPrompt: the `run_js` instructions around the rendered TypeScript.

use crate::catalog::Catalog;
use crate::typescript::{RenderSchemaError, render_typescript};

/// Prompt text for the `run_js` tool and its rough size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The instructions followed by the TypeScript declarations in a fenced block, or, in
    /// discovery form, by a line per capability.
    pub text: String,
    /// Characters divided by four, rounded up: a tokenizer-free estimate of the prompt's cost
    /// in a model's context.
    pub approx_tokens: usize,
    /// Whether this is the discovery form: the declarations were over the budget, so the
    /// prompt lists a line per capability and tells the model to look declarations up with
    /// `tools.$search` and `tools.$describe`.
    pub discovery: bool,
}

/// The discovery budget when none is set: above this many estimated tokens of declarations,
/// `run_js`'s description switches to the discovery form.
pub const DEFAULT_DISCOVERY_TOKENS: u32 = 8_000;

const DISCOVERY: &str = "\
This catalog is large, so below is a line per capability (its call path, its input fields, \
`?` when optional, and what it does), not its declaration. Before calling a capability whose \
input type you have not seen, look it up; both answer from the catalog, call nothing and may \
be awaited in the same program as the calls they help write:
- `await tools.$search({ query: \"create issue\", limit: 5 })` returns the best matching \
capabilities as `[{ id, path, description, declaration }]`, `declaration` being TypeScript.
- `await tools.$describe({ path: \"github.issues.create\" })` returns one capability's \
`{ id, path, description, declaration, examples, needsApproval }`.
";

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
    Ok(RenderedPrompt {
        approx_tokens: approx_tokens(&text),
        text,
        discovery: false,
    })
}

/// Like [`render_prompt`] while its estimate stays within `discovery_tokens`; above it, the
/// discovery form: the instructions, how to use `tools.$search` and `tools.$describe`, and
/// [`Catalog::compact_listing`]. Every capability must still render (the lookups return
/// declarations), so a schema that cannot be rendered fails here in either form.
pub fn render_prompt_within(
    catalog: &Catalog,
    discovery_tokens: u32,
) -> Result<RenderedPrompt, RenderSchemaError> {
    let full = render_prompt(catalog)?;
    if full.approx_tokens <= discovery_tokens as usize {
        return Ok(full);
    }
    let text = format!(
        "{INSTRUCTIONS}\n{DISCOVERY}\n```text\n{}```\n",
        catalog.compact_listing()
    );
    Ok(RenderedPrompt {
        approx_tokens: approx_tokens(&text),
        text,
        discovery: true,
    })
}

fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}
