//! The corpus of real MCP tool schemas (`host/catalog/corpus/`): every server's rendering is
//! snapshotted and compiled by `tsc --strict --noEmit`, and for every tool a generated valid
//! instance must pass both `tsc` and `validate_input`, and a generated invalid one must fail
//! both.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use corral_catalog::{
    Capability, Catalog, DEFAULT_DISCOVERY_TOKENS, render_prompt, render_prompt_within,
    render_typescript,
};
use serde_json::{Map, Value, json};

use crate::rendering::features_catalog;
use crate::{crate_dir, repo_root};

/// Each corpus file with its server name (the file stem), which is also the namespace.
fn corpus() -> anyhow::Result<Vec<(String, Catalog)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(crate_dir().join("corpus"))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "json"));
    files.sort();
    let mut servers = Vec::with_capacity(files.len());
    for path in files {
        let server = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .ok_or(anyhow::anyhow!("bad corpus file name {}", path.display()))?
            .to_owned();
        let catalog = Catalog::from_mcp_tools_json(&std::fs::read_to_string(&path)?, &server)
            .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
        servers.push((server, catalog));
    }
    Ok(servers)
}

#[test]
fn corpus_has_at_least_50_tools_each_from_a_named_source() -> anyhow::Result<()> {
    let sources = std::fs::read_to_string(crate_dir().join("corpus/SOURCES.md"))?;
    let servers = corpus()?;
    for (server, _) in &servers {
        assert!(
            sources.contains(&format!("`{server}.json`")),
            "{server}.json is not in SOURCES.md"
        );
    }
    let tools: usize = servers.iter().map(|(_, catalog)| catalog.len()).sum();
    assert!(tools >= 50, "only {tools} tools in the corpus");
    Ok(())
}

#[test]
fn corpus_renderings_match_snapshots() -> anyhow::Result<()> {
    for (server, catalog) in corpus()? {
        insta::assert_snapshot!(server.clone(), render_typescript(&catalog)?);
    }
    Ok(())
}

/// The compiler: `$CORRAL_TSC`, or what `host/catalog/tests/install-typescript.sh` installs.
fn tsc_path() -> PathBuf {
    match std::env::var_os("CORRAL_TSC") {
        Some(path) => PathBuf::from(path),
        None => repo_root().join("target/node-tools/node_modules/.bin/tsc"),
    }
}

#[test]
fn rendered_typescript_compiles_and_agrees_with_the_validator() -> anyhow::Result<()> {
    let tsc = tsc_path();
    assert!(
        tsc.exists(),
        "TypeScript compiler not found at {}: run host/catalog/tests/install-typescript.sh \
         (or set CORRAL_TSC to a tsc binary). This test does not skip without it.",
        tsc.display()
    );
    let mut subjects: Vec<(String, Catalog, bool)> = corpus()?
        .into_iter()
        .map(|(server, catalog)| (server, catalog, true))
        .collect();
    // The features fixture has capabilities that accept anything, so no invalid instance.
    subjects.push(("features".to_owned(), features_catalog()?, false));

    let folder = tempfile::tempdir()?;
    let mut files = Vec::new();
    let mut checked_tools = 0;
    for (name, catalog, every_tool_has_invalid_input) in &subjects {
        let mut source = render_typescript(catalog)?;
        // Each file is a module so that the servers' declarations do not meet in one scope.
        source.push_str("export {};\n");
        for (index, capability) in catalog.capabilities().iter().enumerate() {
            append_instance_checks(
                &mut source,
                catalog,
                index,
                capability,
                *every_tool_has_invalid_input,
            )
            .map_err(|error| anyhow::anyhow!("{name}: {}: {error}", capability.id))?;
            checked_tools += 1;
        }
        let file = folder.path().join(format!("{name}.ts"));
        std::fs::write(&file, source)?;
        files.push(file);
    }
    assert!(checked_tools >= 50, "only {checked_tools} tools checked");

    let output = Command::new(&tsc)
        .args([
            "--strict", "--noEmit", "--target", "es2022", "--lib", "es2022", "--pretty", "false",
        ])
        .args(&files)
        .output()
        .map_err(|error| anyhow::anyhow!("could not run {}: {error}", tsc.display()))?;
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tsc rejected the rendered TypeScript ({}):\n{report}{}\nfiles kept in {}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        folder.keep().display()
    );
    Ok(())
}

/// Appends, for one capability: a generated valid input assigned to its parameter type and
/// passed to the method, and a generated invalid input that `tsc` must reject too
/// (`@ts-expect-error` fails the compile if it does not). Both are first checked against the
/// validator.
fn append_instance_checks(
    source: &mut String,
    catalog: &Catalog,
    index: usize,
    capability: &Capability,
    require_invalid: bool,
) -> anyhow::Result<()> {
    let method = access_path(&capability.js_path);
    let input_type = format!("Parameters<typeof {method}>[0]");
    let valid = minimal_instance(&capability.input_schema, &capability.input_schema)?;
    catalog.validate_input(index, &valid).map_err(|error| {
        anyhow::anyhow!("generated valid instance {valid} was rejected: {error}")
    })?;
    writeln!(source, "const valid{index}: {input_type} = {valid};").ok();
    writeln!(source, "void {method}(valid{index});").ok();
    let unrestricted = matches!(&capability.input_schema, Value::Bool(true))
        || capability
            .input_schema
            .as_object()
            .is_some_and(Map::is_empty);
    if unrestricted && !require_invalid {
        return Ok(());
    }
    let (invalid, pointer) = invalid_instance(&capability.input_schema, &valid);
    let error = catalog
        .validate_input(index, &invalid)
        .err()
        .ok_or(anyhow::anyhow!(
            "generated invalid instance {invalid} was accepted"
        ))?;
    anyhow::ensure!(
        error
            .violations()
            .iter()
            .any(|violation| violation.pointer == pointer),
        "invalid instance {invalid} failed at other places than {pointer:?}: {error}"
    );
    writeln!(source, "// @ts-expect-error {pointer} has the wrong type").ok();
    writeln!(source, "const invalid{index}: {input_type} = {invalid};").ok();
    Ok(())
}

fn access_path(parts: &[String]) -> String {
    let mut path = String::from("tools");
    for part in parts {
        write!(path, "[{}]", Value::String(part.clone())).ok();
    }
    path
}

/// Follows a local `$ref` (the corpus has no other kind).
fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
    {
        Some(pointer) => root
            .pointer(pointer)
            .map_or(schema, |target| resolve(target, root)),
        None => schema,
    }
}

/// The smallest instance the schema accepts, built from its required parts.
fn minimal_instance(schema: &Value, root: &Value) -> anyhow::Result<Value> {
    let schema = resolve(schema, root);
    let Value::Object(object) = schema else {
        return Ok(Value::Null);
    };
    if let Some(value) = object.get("const") {
        return Ok(value.clone());
    }
    if let Some(first) = object.get("enum").and_then(|values| values.get(0)) {
        return Ok(first.clone());
    }
    let alternatives = object.get("anyOf").or_else(|| object.get("oneOf"));
    if let (Some(Value::Array(members)), false) = (alternatives, object.contains_key("type"))
        && let Some(first) = members.first()
    {
        return minimal_instance(first, root);
    }
    let type_name = match object.get("type") {
        Some(Value::String(name)) => name.as_str(),
        Some(Value::Array(names)) => names
            .iter()
            .filter_map(Value::as_str)
            .find(|name| *name != "null")
            .unwrap_or("null"),
        _ if object.contains_key("properties") => "object",
        _ => return Ok(Value::Null),
    };
    Ok(match type_name {
        "object" => {
            let mut instance = Map::new();
            let required = object
                .get("required")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for name in required.iter().filter_map(Value::as_str) {
                let property = object
                    .get("properties")
                    .and_then(|p| p.get(name))
                    .unwrap_or(&Value::Bool(true));
                instance.insert(name.to_owned(), minimal_instance(property, root)?);
            }
            Value::Object(instance)
        }
        "array" => {
            let count = object.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let tuple = match (object.get("prefixItems"), object.get("items")) {
                (Some(Value::Array(prefix)), _) | (None, Some(Value::Array(prefix))) => {
                    prefix.as_slice()
                }
                _ => &[],
            };
            let rest = match object.get("items") {
                Some(Value::Array(_)) => object.get("additionalItems"),
                items => items,
            };
            let mut items = Vec::new();
            for position in 0..usize::try_from(count)? {
                let item_schema = tuple.get(position).or(rest).unwrap_or(&Value::Bool(true));
                items.push(minimal_instance(item_schema, root)?);
            }
            Value::Array(items)
        }
        "string" => {
            let text = match object.get("format").and_then(Value::as_str) {
                Some("uri" | "url") => "https://example.com/".to_owned(),
                Some("date-time") => "2025-01-01T00:00:00Z".to_owned(),
                Some("date") => "2025-01-01".to_owned(),
                Some("email") => "user@example.com".to_owned(),
                _ => {
                    let length = object.get("minLength").and_then(Value::as_u64).unwrap_or(1);
                    "x".repeat(usize::try_from(length.max(1))?)
                }
            };
            Value::String(text)
        }
        "integer" | "number" => {
            let minimum = object.get("minimum").and_then(Value::as_i64).unwrap_or(0);
            json!(
                minimum.max(
                    object
                        .get("exclusiveMinimum")
                        .and_then(Value::as_i64)
                        .map_or(minimum, |m| m + 1)
                )
            )
        }
        "boolean" => Value::Bool(false),
        _ => Value::Null,
    })
}

/// `valid` with one property given a value of the wrong primitive type, preferring required
/// ones, and the pointer that must then fail. A schema with no such property gets a string
/// where its object should be.
fn invalid_instance(schema: &Value, valid: &Value) -> (Value, String) {
    let wrong_value = |property: &Value| match property.get("type").and_then(Value::as_str) {
        Some("string") => Some(json!(12345)),
        Some("number" | "integer") => Some(json!("not a number")),
        Some("boolean") => Some(json!("not a boolean")),
        Some("array") => Some(json!({"not": "an array"})),
        _ => None,
    };
    let properties: BTreeMap<usize, (&String, &Value)> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| properties.iter().enumerate().collect())
        .unwrap_or_default();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut candidates: Vec<(&String, &Value)> = properties.values().copied().collect();
    candidates.sort_by_key(|(name, _)| !required.contains(&name.as_str()));
    for (name, property) in candidates {
        if let (Some(wrong), Value::Object(object)) = (wrong_value(property), valid) {
            let mut invalid = object.clone();
            invalid.insert(name.clone(), wrong);
            return (
                Value::Object(invalid),
                format!("/{}", name.replace('~', "~0").replace('/', "~1")),
            );
        }
    }
    (json!("not an object"), String::new())
}

/// The corpus as one catalog: every server under its own namespace, `copies` times (copy `k`
/// of server `s` under `s-k`), as an agent with that many real MCP servers would have it.
fn combined(copies: usize) -> anyhow::Result<Catalog> {
    let servers: Vec<String> = corpus()?.into_iter().map(|(server, _)| server).collect();
    let mut capabilities = Vec::new();
    for copy in 0..copies {
        for server in &servers {
            let namespace = match copy {
                0 => server.clone(),
                k => format!("{server}-{k}"),
            };
            let text = std::fs::read_to_string(crate_dir().join(format!("corpus/{server}.json")))?;
            let catalog = Catalog::from_mcp_tools_json(&text, &namespace)
                .map_err(|error| anyhow::anyhow!("{namespace}: {error}"))?;
            capabilities.extend(catalog.capabilities().iter().cloned());
        }
    }
    Ok(Catalog::new(capabilities)?)
}

/// Discovery: above the default budget, `run_js`'s description lists a line per tool; the
/// figures (tokens estimated as the prompt estimates them) are written to
/// `target/test-logs/catalog/discovery-tokens.txt` and quoted in docs/model-context.md.
#[test]
fn discovery_shrinks_the_description_of_large_catalogs() -> anyhow::Result<()> {
    let github = corpus()?
        .into_iter()
        .find(|(server, _)| server == "github")
        .map(|(_, catalog)| catalog)
        .ok_or(anyhow::anyhow!("no github corpus"))?;
    // Each with the least it must shrink by: the instructions are a fixed part of both forms.
    let subjects = [
        ("github", github, 2),
        ("corpus", combined(1)?, 3),
        ("corpus x3", combined(3)?, 3),
    ];
    let mut figures = String::from("catalog\ttools\tdeclarations\tdiscovery form\n");
    for (name, catalog, shrink) in &subjects {
        let full = render_prompt(catalog)?;
        let within = render_prompt_within(catalog, DEFAULT_DISCOVERY_TOKENS)?;
        let forced = render_prompt_within(catalog, 0)?;
        assert!(!full.discovery && forced.discovery);
        // Within the budget the description is the full one, byte for byte.
        assert_eq!(
            within.discovery,
            full.approx_tokens > DEFAULT_DISCOVERY_TOKENS as usize
        );
        if !within.discovery {
            assert_eq!(within.text, full.text);
        }
        // Every tool has its line.
        for capability in catalog.capabilities() {
            let line = format!("  tools.{}(", capability.js_path.join("."));
            let quoted = capability.js_path.iter().any(|p| p.contains('-'));
            assert!(quoted || forced.text.contains(&line), "{line}");
        }
        assert!(
            forced.approx_tokens * shrink < full.approx_tokens,
            "{name}: {} tokens in discovery form, {} in full",
            forced.approx_tokens,
            full.approx_tokens
        );
        writeln!(
            figures,
            "{name}\t{}\t{}\t{}",
            catalog.len(),
            full.approx_tokens,
            forced.approx_tokens
        )?;
    }
    assert!(subjects[2].1.len() >= 300);
    let logs = repo_root().join("target/test-logs/catalog");
    std::fs::create_dir_all(&logs)?;
    std::fs::write(logs.join("discovery-tokens.txt"), &figures)?;
    eprint!("{figures}");
    Ok(())
}

/// A search over the whole corpus finds what a model would ask for, and a describe of a
/// result gives a declaration with its input type.
#[test]
fn search_finds_corpus_tools_by_what_they_do() -> anyhow::Result<()> {
    let catalog = combined(1)?;
    let ids = |query: &str| -> anyhow::Result<Vec<String>> {
        Ok(catalog
            .search(query, 3)?
            .iter()
            .filter_map(|hit| hit["id"].as_str().map(str::to_owned))
            .collect())
    };
    assert!(
        ids("create issue")?.contains(&"github.create_issue".to_owned()),
        "{:?}",
        ids("create issue")?
    );
    assert_eq!(ids("geocode")?[0], "google-maps.maps_geocode");
    assert!(
        ids("read file")?
            .iter()
            .any(|id| id.starts_with("filesystem.read"))
    );
    let described = catalog.describe("github.create_issue")?;
    assert!(
        described["declaration"]
            .as_str()
            .is_some_and(|d| d.contains("create_issue(input: GithubCreateIssueInput)")),
        "{described}"
    );
    Ok(())
}
