//! Pre-flight: before a script runs, every call it makes through a statically visible path of
//! the global `tools` (`tools.github.issues.list(...)`, `tools["github.issues.list"](...)`) is
//! resolved against the session's bound catalog. A path that binds nothing fails the script
//! before it starts, with no fuel charged and no call made, so a mistyped tool name cannot
//! fail a script halfway, after its earlier calls already had effects.
//!
//! The script is parsed (as the body of an async function, as the guest runs it) by
//! `oxc_parser`, and `oxc_semantic` tells the global `tools` from a local of the same name.
//! Only what the source shows is checked: a path built at run time (`tools[name]`, an alias
//! `const t = tools.github`) fails at run time as before. A script that does not parse is left
//! to the guest, which reports the `SyntaxError` with its location as it always has.

use corral_catalog::Catalog;
use oxc_allocator::Allocator;
use oxc_ast::ast::{CallExpression, Expression};
use oxc_ast_visit::{Visit, walk};
use oxc_parser::{ParseOptions, Parser};
use oxc_semantic::{Scoping, SemanticBuilder};
use oxc_span::{GetSpan, SourceType};
use serde::{Deserialize, Serialize};

/// The most unknown paths one error lists.
pub const MAX_REPORTED_PATHS: usize = 10;

/// What the guest's wrapper puts before the script: its lines shift by this.
const PREFIX: &str = "(async function () {\n";
const SUFFIX: &str = "\n})";

/// A call through `tools` that binds nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownPath {
    /// The path as written, such as `tools.github.isues.list`.
    pub path: String,
    /// 1-based line of the path in the script.
    pub line: u32,
    /// 1-based column (in characters) of the path in the script.
    pub column: u32,
    /// The nearest capability ids, best first (possibly none).
    pub suggestions: Vec<String>,
}

/// The script calls paths of `tools` that bind nothing; it was not run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}", describe(.unknown))]
pub struct PreflightError {
    /// The unknown paths, in source order (at most [`MAX_REPORTED_PATHS`]).
    pub unknown: Vec<UnknownPath>,
}

fn describe(unknown: &[UnknownPath]) -> String {
    let mut text = String::new();
    for (i, path) in unknown.iter().enumerate() {
        if i > 0 {
            text.push_str("; ");
        }
        text.push_str(&format!(
            "{} is not a tool (line {}, column {}){}",
            path.path,
            path.line,
            path.column,
            corral_catalog::did_you_mean(&path.suggestions)
        ));
    }
    text.push_str(": the script was not run, nothing was called");
    text
}

/// Checks `source`'s statically visible calls through `tools` against `catalog`, as
/// [`crate::ExecutorSession::run`] does before every script (exported for hosts that want to
/// check a script without running it).
pub fn preflight(source: &str, catalog: &Catalog) -> Result<(), PreflightError> {
    let wrapped = format!("{PREFIX}{source}{SUFFIX}");
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, &wrapped, SourceType::script())
        .with_options(ParseOptions {
            allow_return_outside_function: true,
            ..ParseOptions::default()
        })
        .parse();
    if parsed.panicked || !parsed.diagnostics.is_empty() {
        return Ok(());
    }
    let semantic = SemanticBuilder::new().build(&parsed.program).semantic;
    let mut finder = Finder {
        scoping: semantic.scoping(),
        catalog,
        source: &wrapped,
        unknown: Vec::new(),
    };
    finder.visit_program(&parsed.program);
    if finder.unknown.is_empty() {
        Ok(())
    } else {
        Err(PreflightError {
            unknown: finder.unknown,
        })
    }
}

struct Finder<'s> {
    scoping: &'s Scoping,
    catalog: &'s Catalog,
    source: &'s str,
    unknown: Vec<UnknownPath>,
}

impl<'a> Visit<'a> for Finder<'_> {
    fn visit_call_expression(&mut self, call: &CallExpression<'a>) {
        if self.unknown.len() < MAX_REPORTED_PATHS
            && let Some(path) = self.tools_path(&call.callee)
            && !self.binds(&path)
        {
            let start = call.callee.span().start as usize;
            let (line, column) = self.position(start);
            let written = self.source[start..call.callee.span().end as usize].to_owned();
            let dotted = path.join(".");
            self.unknown.push(UnknownPath {
                path: written,
                line,
                column,
                suggestions: self.catalog.nearest_names(&dotted, 3),
            });
        }
        walk::walk_call_expression(self, call);
    }
}

impl Finder<'_> {
    /// The names of `tools.a.b.c` or `tools["a.b"]` when `callee` is such a path of the global
    /// `tools` written with static names only.
    fn tools_path(&self, callee: &Expression) -> Option<Vec<String>> {
        let mut names = Vec::new();
        let mut expression = callee.get_inner_expression();
        loop {
            match expression {
                Expression::StaticMemberExpression(member) => {
                    names.push(member.property.name.to_string());
                    expression = member.object.get_inner_expression();
                }
                Expression::ComputedMemberExpression(member) => {
                    let Expression::StringLiteral(name) = member.expression.get_inner_expression()
                    else {
                        return None;
                    };
                    names.push(name.value.to_string());
                    expression = member.object.get_inner_expression();
                }
                Expression::Identifier(identifier) if identifier.name == "tools" => {
                    let reference = identifier.reference_id.get()?;
                    let global = self.scoping.get_reference(reference).symbol_id().is_none();
                    names.reverse();
                    return (global && !names.is_empty()).then_some(names);
                }
                _ => return None,
            }
        }
    }

    /// Whether calling `path` reaches a capability: its JS path, its id under `tools` directly,
    /// or either followed by `.call`, `.apply` or `.bind`.
    fn binds(&self, path: &[String]) -> bool {
        let is_function = |path: &[String]| {
            (path.len() == 1 && self.catalog.get(&path[0]).is_some())
                || self.catalog.get_by_path(path).is_some()
        };
        match path {
            [rest @ .., last] if matches!(last.as_str(), "call" | "apply" | "bind") => {
                is_function(rest) || is_function(path)
            }
            _ => is_function(path),
        }
    }

    /// The 1-based line and column in the script of a byte offset in the wrapped source.
    fn position(&self, offset: usize) -> (u32, u32) {
        let before = &self.source[..offset];
        let line = before.matches('\n').count();
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(column).unwrap_or(u32::MAX),
        )
    }
}

#[cfg(test)]
mod tests {
    use corral_catalog::Capability;
    use serde_json::json;

    use super::*;

    fn catalog() -> Catalog {
        let object = json!({"type": "object"});
        let mut renamed = Capability::new("slack.post-message", object.clone());
        renamed.js_path = vec!["slack".into(), "postMessage".into()];
        Catalog::new(vec![
            Capability::new("github.issues.list", object.clone()),
            Capability::new("github.issues.create", object),
            renamed,
        ])
        .expect("as the test built it")
    }

    fn unknown(source: &str) -> Vec<(String, u32, u32, Vec<String>)> {
        match preflight(source, &catalog()) {
            Ok(()) => Vec::new(),
            Err(error) => error
                .unknown
                .into_iter()
                .map(|u| (u.path, u.line, u.column, u.suggestions))
                .collect(),
        }
    }

    #[test]
    fn known_paths_pass() {
        let script = r#"
            const a = await tools.github.issues.list({});
            await tools["github.issues.create"]({});
            await tools.github["issues"].list.call(null, {});
            await tools.slack.postMessage({});
            await tools?.github?.issues?.list?.({});
            return (tools.github.issues.list)({});
        "#;
        assert_eq!(unknown(script), []);
    }

    #[test]
    fn unknown_paths_are_named_with_their_place_and_neighbours() {
        let script = "await tools.github.issues.list({});\n  await tools.github.isues.list({});\nawait tools['nope']({});";
        assert_eq!(
            unknown(script),
            [
                (
                    "tools.github.isues.list".into(),
                    2,
                    9,
                    vec!["github.issues.list".into()]
                ),
                ("tools['nope']".into(), 3, 7, vec![]),
            ]
        );
        let error = preflight(script, &catalog()).expect_err("an error");
        assert_eq!(
            error.to_string(),
            "tools.github.isues.list is not a tool (line 2, column 9) (did you mean \
             `github.issues.list`?); tools['nope'] is not a tool (line 3, column 7): the script \
             was not run, nothing was called"
        );
    }

    #[test]
    fn a_namespace_is_not_callable() {
        assert_eq!(unknown("tools.github.issues({})").len(), 1);
        assert_eq!(unknown("tools.slack['post-message']({})").len(), 1);
    }

    #[test]
    fn dynamic_shadowed_and_unparsable_scripts_are_left_to_run_time() {
        for script in [
            "const name = 'nope'; await tools[name]({});",
            "const t = tools.github; await t.nope({});",
            "const tools = {x() {}}; tools.x();",
            "function f(tools) { return tools.nope(); }",
            "await tools.github.issues.list(",
            "",
        ] {
            assert_eq!(unknown(script), [], "{script}");
        }
    }
}
