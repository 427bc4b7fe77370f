//! Discovery for large catalogs: a line per capability instead of its whole declaration, and
//! lookups (`search`, `describe`) answered from the catalog alone, so a model pays for the
//! declarations it reads rather than for every one on every call.
//!
//! - [`Catalog::compact_listing`] is what `run_js`'s description shows above the discovery
//!   budget ([`crate::render_prompt_within`]): the capabilities grouped by their first path
//!   segment, each as its call path, its top-level input fields (`?` when optional) and the
//!   first sentence of its description.
//! - [`Catalog::search`] ranks capabilities against a query's words (id and path first, then
//!   field names, then the description) and returns the best ones with their TypeScript.
//! - [`Catalog::describe`] returns one capability's declaration and examples by id or path;
//!   an unknown name fails with the nearest existing names ([`Catalog::nearest_names`]).
//!
//! All three are pure functions of the catalog: the same catalog gives the same answers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::capability::Capability;
use crate::catalog::Catalog;
use crate::js;
use crate::typescript::{RenderSchemaError, render_capabilities};

/// The most characters of a description a compact line keeps.
const LINE_DESCRIPTION_CHARS: usize = 100;
/// The most results one search returns.
pub const MAX_SEARCH_RESULTS: usize = 20;
/// How many results a search returns when it is not told.
pub const DEFAULT_SEARCH_RESULTS: usize = 5;

/// Why [`Catalog::describe`] found nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescribeError {
    /// No capability has this id or path.
    #[error("no tool {name}{}", did_you_mean(.suggestions))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The nearest existing ids, best first.
        suggestions: Vec<String>,
    },
    /// The capability's schema cannot be rendered.
    #[error(transparent)]
    Render(#[from] RenderSchemaError),
}

/// `"; did you mean `a` or `b`?"`, or nothing when there is no suggestion.
pub fn did_you_mean(suggestions: &[String]) -> String {
    match suggestions {
        [] => String::new(),
        [one] => format!(" (did you mean `{one}`?)"),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(|s| format!("`{s}`")).collect();
            format!(" (did you mean {} or `{last}`?)", rest.join(", "))
        }
    }
}

impl Catalog {
    /// A line per capability, grouped under the first segment of its path:
    ///
    /// ```text
    /// github (2 tools)
    ///   tools.github.issues.list({repo, state?}): List the issues of a repository.
    /// ```
    pub fn compact_listing(&self) -> String {
        let mut groups: BTreeMap<&str, Vec<&Capability>> = BTreeMap::new();
        for capability in self.capabilities() {
            let group = capability.js_path.first().map_or("", String::as_str);
            groups.entry(group).or_default().push(capability);
        }
        let mut out = String::new();
        for (group, capabilities) in groups {
            let count = capabilities.len();
            let noun = if count == 1 { "tool" } else { "tools" };
            let _ = writeln!(out, "{group} ({count} {noun})");
            for capability in capabilities {
                let _ = write!(out, "  {}({})", path_of(capability), fields(capability));
                let summary = summary(capability.description.as_deref().unwrap_or_default());
                if !summary.is_empty() {
                    let _ = write!(out, ": {summary}");
                }
                out.push('\n');
            }
        }
        out
    }

    /// The capabilities that best match `query`'s words, at most `limit` (capped at
    /// [`MAX_SEARCH_RESULTS`]), each as `{id, path, description, declaration}`; best first,
    /// ties in catalog order. A capability matching none of the words is left out.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<Value>, RenderSchemaError> {
        let terms = words(query);
        let mut scored: Vec<(u32, usize)> = self
            .capabilities()
            .iter()
            .enumerate()
            .filter_map(|(index, capability)| {
                let score = score(capability, &terms, &query.to_lowercase());
                (score > 0).then_some((score, index))
            })
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        scored
            .into_iter()
            .take(limit.min(MAX_SEARCH_RESULTS))
            .map(|(_, index)| {
                let capability = &self.capabilities()[index];
                Ok(json!({
                    "id": capability.id,
                    "path": path_of(capability),
                    "description": capability.description.as_deref().unwrap_or_default(),
                    "declaration": declaration(capability)?,
                }))
            })
            .collect()
    }

    /// One capability by id (`github.issues.list`) or path (`tools.github.issues.list`,
    /// `tools["github.issues.list"]`), as `{id, path, description, declaration, examples,
    /// needsApproval}`.
    pub fn describe(&self, name: &str) -> Result<Value, DescribeError> {
        let capability = self.find(name).ok_or_else(|| DescribeError::Unknown {
            name: name.to_owned(),
            suggestions: self.nearest_names(name, 3),
        })?;
        Ok(json!({
            "id": capability.id,
            "path": path_of(capability),
            "description": capability.description.as_deref().unwrap_or_default(),
            "declaration": declaration(capability)?,
            "examples": capability.examples,
            "needsApproval": capability.needs_approval,
        }))
    }

    /// The capability a name written by a model means: its id, its dotted JS path, or either
    /// after `tools.` (or inside `tools["..."]`).
    fn find(&self, name: &str) -> Option<&Capability> {
        let name = name.trim();
        let name = name
            .strip_prefix("tools[")
            .and_then(|rest| rest.strip_suffix(']'))
            .map(|quoted| quoted.trim_matches(|c| c == '"' || c == '\''))
            .or_else(|| name.strip_prefix("tools."))
            .unwrap_or(name);
        if let Some((_, capability)) = self.get(name) {
            return Some(capability);
        }
        self.capabilities()
            .iter()
            .find(|capability| capability.js_path.join(".") == name)
    }

    /// Up to `n` existing ids nearest to `name` by edit distance, best first: those close enough
    /// to be a plausible slip (at most a third of the longer name's characters apart, or sharing
    /// the name's last segment), and of those only the nearest and any one edit further.
    pub fn nearest_names(&self, name: &str, n: usize) -> Vec<String> {
        let name = name.strip_prefix("tools.").unwrap_or(name);
        let wanted = name.to_lowercase();
        let last = wanted.rsplit('.').next().unwrap_or_default().to_owned();
        let mut ranked: Vec<(usize, &str)> = self
            .capabilities()
            .iter()
            .filter_map(|capability| {
                let id = capability.id.as_str();
                let lowered = id.to_lowercase();
                let distance = edit_distance(&wanted, &lowered);
                let longest = wanted.chars().count().max(lowered.chars().count());
                let same_leaf = !last.is_empty() && lowered.rsplit('.').next() == Some(&last);
                (distance * 3 <= longest || same_leaf).then_some((distance, id))
            })
            .collect();
        ranked.sort();
        // Only the nearest: a name one edit further than the best is as likely, more is noise.
        let best = ranked.first().map_or(0, |(distance, _)| *distance);
        ranked
            .into_iter()
            .take_while(|(distance, _)| *distance <= best + 1)
            .take(n)
            .map(|(_, id)| id.to_owned())
            .collect()
    }
}

/// The expression a script calls: `tools.github.issues.list`.
fn path_of(capability: &Capability) -> String {
    js::access_path(capability.js_path.iter().map(String::as_str))
}

/// The top-level input fields: `repo, state?` (required ones first, in schema order).
fn fields(capability: &Capability) -> String {
    let Some(properties) = capability.input_schema["properties"].as_object() else {
        return String::new();
    };
    let required: Vec<&str> = capability.input_schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut names: Vec<String> = required
        .iter()
        .filter(|name| properties.contains_key(**name))
        .map(|name| js::property_name(name))
        .collect();
    for name in properties.keys() {
        if !required.contains(&name.as_str()) {
            names.push(format!("{}?", js::property_name(name)));
        }
    }
    if names.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", names.join(", "))
    }
}

/// The first sentence (or line) of a description, cut at [`LINE_DESCRIPTION_CHARS`].
fn summary(description: &str) -> String {
    let line = description.lines().map(str::trim).find(|l| !l.is_empty());
    let line = line.unwrap_or_default();
    let sentence = match line.find(". ") {
        Some(end) => &line[..=end],
        None => line,
    };
    if sentence.chars().count() <= LINE_DESCRIPTION_CHARS {
        return sentence.to_owned();
    }
    let cut: String = sentence.chars().take(LINE_DESCRIPTION_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// One capability's TypeScript: its named types and its place under `declare const tools`.
fn declaration(capability: &Capability) -> Result<String, RenderSchemaError> {
    let rendered = render_capabilities(std::slice::from_ref(capability))?;
    Ok(rendered
        .split_once('\n')
        .map_or(rendered.clone(), |(_, rest)| rest.to_owned()))
}

/// Lower-case words of a query or a name: split on anything not alphanumeric and on
/// lower-to-upper case changes (`listIssues` is `list`, `issues`).
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// How well `capability` matches the query: per query word, 4 for a word of its id or path,
/// 2 for a field name, 1 for a description word (a word's plural or prefix of at least four
/// letters counts), and 6 more when the whole query appears in its id.
fn score(capability: &Capability, terms: &[String], query: &str) -> u32 {
    let mut name_words = words(&capability.id);
    name_words.extend(capability.js_path.iter().flat_map(|part| words(part)));
    let field_words: Vec<String> = capability.input_schema["properties"]
        .as_object()
        .map(|properties| properties.keys().flat_map(|key| words(key)).collect())
        .unwrap_or_default();
    let description_words = words(capability.description.as_deref().unwrap_or_default());
    let matches = |term: &str, candidates: &[String]| {
        candidates.iter().any(|word| {
            word == term
                || (term.len() >= 4 && (word.starts_with(term) || term.starts_with(word.as_str())))
                    && word.len() >= 3
        })
    };
    let mut total = 0;
    for term in terms {
        if matches(term, &name_words) {
            total += 4;
        } else if matches(term, &field_words) {
            total += 2;
        } else if matches(term, &description_words) {
            total += 1;
        }
    }
    let query = query.trim();
    if !query.is_empty() && capability.id.to_lowercase().contains(query) {
        total += 6;
    }
    total
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        let mut list = Capability::new(
            "github.issues.list",
            json!({"type": "object", "properties": {
                "state": {"enum": ["open", "closed"]}, "repo": {"type": "string"}},
                "required": ["repo"]}),
        );
        list.description = Some("List the issues of a repository. Newest first.".into());
        let mut create = Capability::new(
            "github.issues.create",
            json!({"type": "object", "properties": {"repo": {"type": "string"},
                "title": {"type": "string"}}, "required": ["repo", "title"]}),
        );
        create.description = Some("Open a new issue.".into());
        create.examples = vec![json!({"repo": "corral", "title": "hi"})];
        let mut weather = Capability::new("weather.current", json!({"type": "object"}));
        weather.description = Some("The weather now at a place.".into());
        Catalog::new(vec![list, create, weather]).expect("as the test built it")
    }

    #[test]
    fn the_listing_has_a_line_per_capability_under_its_namespace() {
        assert_eq!(
            catalog().compact_listing(),
            "github (2 tools)\n\
             \x20 tools.github.issues.list({repo, state?}): List the issues of a repository.\n\
             \x20 tools.github.issues.create({repo, title}): Open a new issue.\n\
             weather (1 tool)\n\
             \x20 tools.weather.current(): The weather now at a place.\n"
        );
    }

    #[test]
    fn search_ranks_names_over_descriptions_and_leaves_out_non_matches() {
        let catalog = catalog();
        let hits = catalog
            .search("create an issue", 5)
            .expect("as the test built it");
        let ids: Vec<&str> = hits
            .iter()
            .map(|hit| hit["id"].as_str().expect("as the test built it"))
            .collect();
        assert_eq!(ids, ["github.issues.create", "github.issues.list"]);
        assert!(
            hits[0]["declaration"]
                .as_str()
                .expect("as the test built it")
                .contains("create(input: GithubIssuesCreateInput): Promise<unknown>;")
        );
        assert!(
            catalog
                .search("weather", 5)
                .expect("as the test built it")
                .len()
                == 1
        );
        assert!(
            catalog
                .search("zzz", 5)
                .expect("as the test built it")
                .is_empty()
        );
        assert_eq!(
            catalog
                .search("issues", 1)
                .expect("as the test built it")
                .len(),
            1
        );
    }

    #[test]
    fn describe_takes_ids_and_paths_and_suggests_near_names() {
        let catalog = catalog();
        for name in [
            "github.issues.create",
            "tools.github.issues.create",
            "tools[\"github.issues.create\"]",
        ] {
            let described = catalog.describe(name).expect("as the test built it");
            assert_eq!(described["id"], "github.issues.create", "{name}");
            assert_eq!(described["examples"][0]["title"], "hi");
        }
        let error = catalog
            .describe("github.issue.create")
            .expect_err("an error");
        assert_eq!(
            error.to_string(),
            "no tool github.issue.create (did you mean `github.issues.create`?)"
        );
        assert_eq!(
            catalog.describe("nothing.like.it").expect_err("an error"),
            DescribeError::Unknown {
                name: "nothing.like.it".into(),
                suggestions: vec![]
            }
        );
    }

    #[test]
    fn words_split_case_and_punctuation() {
        assert_eq!(
            words("listIssues get-PR v2_x"),
            ["list", "issues", "get", "pr", "v2", "x"]
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
