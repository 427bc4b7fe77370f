//! Fuzzing on stable Rust: structured inputs drawn with `arbitrary` from a seeded byte stream,
//! one trial per target, named `fuzz::TARGET` (`--test slow fuzz::` runs them all; the last runs
//! are in `fuzz/README.md`). (`cargo fuzz` needs a nightly toolchain, which these machines do not
//! have; `arbitrary` is already in the lockfile, so no new dependency is built. There is no
//! shrinking: a failure prints the seed that reproduces it.)
//!
//! Targets:
//! - `json_boundary`: arbitrary JSON values cross the boundary both ways (a script returns
//!   them, and they travel through a capability call and back) and must arrive equal.
//! - `scripts`: token soup made of the fragments hostile scripts are made of (braces that try
//!   to close the wrapper, comments, lone surrogates, NUL, calls, throws, logs, loops) must
//!   end in a typed outcome, never `internal_error`, and leave the sandbox working.
//! - `schemas`: arbitrary JSON Schemas load and render, or fail with a message naming where;
//!   validating arbitrary instances against them never panics.
//! - `catalog_parser`: mutated and random catalog texts in both formats never panic the parser
//!   or the renderers.
//! - `typescript_agrees`: what the rendered TypeScript accepts, judged by [`ts_judge`] (the
//!   rules of `tsc --strict` on the subset of TypeScript the renderer emits), against what the
//!   validator accepts, on instances drawn from each schema: for any schema, no instance the
//!   validator accepts is refused by its type (TypeScript is wider where it cannot say what a
//!   keyword says); for schemas made only of keywords TypeScript expresses exactly, the two
//!   accept exactly the same instances.
//!
//! By default each target runs a fixed number of cases from fixed seeds (the short run of
//! `scripts/test`). `CORRAL_FUZZ_SECONDS=N` runs each selected target for N seconds from a
//! random seed instead (`scripts/fuzz TARGET SECONDS`); `CORRAL_FUZZ_SEED=S` replays one case.

mod ts_judge;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::{Result as DrawResult, Unstructured};
use corral_catalog::{Catalog, render_prompt, render_typescript};
use corral_sandbox::examples::{ExampleBackend, example_catalog};
use corral_sandbox::{SessionLimits, SessionOptions};
use corral_tests::sandbox;
use libtest_mimic::{Failed, Trial};
use serde_json::{Map, Value, json};

type Target = fn(&mut Unstructured<'_>, &tokio::runtime::Runtime) -> Result<(), String>;

/// One trial per target.
pub fn trials() -> Vec<Trial> {
    let targets: [(&str, Target, u64); 5] = [
        ("json_boundary", json_boundary, 150),
        ("scripts", scripts, 300),
        ("schemas", schemas, 1500),
        ("catalog_parser", catalog_parser, 3000),
        ("typescript_agrees", typescript_agrees, 1500),
    ];
    targets
        .into_iter()
        .map(|(name, target, cases)| {
            Trial::test(format!("fuzz::{name}"), move || {
                run_target(name, target, cases)
            })
        })
        .collect()
}

fn run_target(name: &str, target: Target, cases: u64) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let seconds = std::env::var("CORRAL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let replay = std::env::var("CORRAL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let first_seed = match (replay, seconds) {
        (Some(seed), _) => seed,
        (None, Some(_)) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        (None, None) => 0x5eed_0000,
    };
    let until = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    // A stack overflow aborts the process before a finding can be reported: with
    // CORRAL_FUZZ_TRACE set, every seed is written before its case runs.
    let trace = std::env::var_os("CORRAL_FUZZ_TRACE").is_some();
    eprintln!("fuzz {name}: starting from seed {first_seed}");
    let started = Instant::now();
    let mut ran = 0u64;
    loop {
        let done = match (replay, until) {
            (Some(_), _) => ran == 1,
            (None, Some(until)) => Instant::now() >= until,
            (None, None) => ran == cases,
        };
        if done {
            break;
        }
        let seed = first_seed.wrapping_add(ran);
        if trace {
            eprintln!("fuzz {name}: case seed {seed}");
        }
        let bytes = seeded_bytes(seed);
        let mut input = Unstructured::new(&bytes);
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| target(&mut input, &runtime)));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(finding)) => {
                return Err(
                    format!("{name}: seed {seed} (CORRAL_FUZZ_SEED={seed}): {finding}").into(),
                );
            }
            Err(_) => {
                return Err(
                    format!("{name}: seed {seed} (CORRAL_FUZZ_SEED={seed}) panicked").into(),
                );
            }
        }
        ran += 1;
    }
    eprintln!(
        "fuzz {name}: {ran} cases in {:.1} s from seed {first_seed}, no findings",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Up to 4 KiB of bytes from a splitmix64 stream.
fn seeded_bytes(seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = state;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    let len = (next() % 4096) as usize + 64;
    (0..len).map(|_| next() as u8).collect()
}

// ---- JSON values ----------------------------------------------------------------------------

fn draw_json(u: &mut Unstructured<'_>, depth: u32) -> DrawResult<Value> {
    let pick = u.int_in_range(0..=if depth == 0 { 4 } else { 6 })?;
    Ok(match pick {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::from(u.int_in_range(-(1i64 << 53)..=(1i64 << 53))?),
        3 => {
            let f: f64 = u.arbitrary()?;
            if f.is_finite() { json!(f) } else { json!(0.5) }
        }
        4 => Value::String(u.arbitrary()?),
        5 => {
            let n = u.int_in_range(0..=4)?;
            Value::Array(
                (0..n)
                    .map(|_| draw_json(u, depth - 1))
                    .collect::<DrawResult<_>>()?,
            )
        }
        _ => {
            let n = u.int_in_range(0..=4)?;
            let mut map = Map::new();
            for _ in 0..n {
                let key: String = u.arbitrary()?;
                map.insert(key, draw_json(u, depth - 1)?);
            }
            Value::Object(map)
        }
    })
}

/// Equality with numbers compared as numbers (JavaScript has one number type).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn run_script(
    runtime: &tokio::runtime::Runtime,
    limits: SessionLimits,
    source: &str,
) -> Result<corral_sandbox::ScriptReport, String> {
    runtime.block_on(async {
        let options = SessionOptions {
            limits,
            ..SessionOptions::new(Arc::new(example_catalog()), Arc::new(ExampleBackend))
        };
        let mut session = sandbox()
            .session(options)
            .await
            .map_err(|e| format!("session: {e}"))?;
        Ok(session.run(source).await)
    })
}

fn json_boundary(
    u: &mut Unstructured<'_>,
    runtime: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let value = draw_json(u, 5).map_err(|e| e.to_string())?;
    // The JSON text as a JavaScript string literal (JSON strings are JavaScript strings).
    let literal = serde_json::to_string(&value.to_string()).map_err(|e| e.to_string())?;
    for script in [
        format!("return JSON.parse({literal})"),
        format!("return (await tools.examples.echo({{v: JSON.parse({literal})}})).v"),
    ] {
        let report = run_script(runtime, SessionLimits::default(), &script)?;
        match &report.outcome {
            Ok(Some(back)) if same_json(back, &value) => {}
            other => return Err(format!("{value} came back as {other:?}")),
        }
    }
    Ok(())
}

// ---- scripts --------------------------------------------------------------------------------

const FRAGMENTS: &[&str] = &[
    "}",
    "{",
    ")",
    "(",
    "]",
    "[",
    "})()",
    "})(); (function(){",
    "});",
    "(async () => {",
    ";",
    "\n",
    " ",
    "//",
    "/*",
    "*/",
    "\"",
    "'",
    "`",
    "${",
    "\\",
    "\0",
    "\\ud800",
    "'\\udc00'",
    "return ",
    "return 1;",
    "await ",
    "throw ",
    "throw new Error('e');",
    "new Error('x')",
    "tools.examples.echo({a: 1})",
    "tools.examples.fail({message: 'm'})",
    "tools.examples.sleep({ms: 1})",
    "tools.examples.echo(",
    "console.log('\\ud800')",
    "log('toString', 'x')",
    "log('info', 'm', {a: [1]})",
    "for (;;) {}",
    "while (true) console.log()",
    "x = 1;",
    "let a = ",
    "const b = [",
    "function f() {",
    "f()",
    "=>",
    "async ",
    "if (1) ",
    "else ",
    "try { ",
    "} catch (e) { ",
    "} finally { ",
    "e.name",
    "Object.prototype.get = 1;",
    "Error.prepareStackTrace = () => 1;",
    "JSON.parse('[[[[')",
    "'x'.repeat(1e6)",
    "globalThis",
    "user",
    "tools",
    "eval(",
    "Function(",
    "import(",
    "-->",
    "<!--",
    "/(a+)+$/.test('aaaaaaaaaaaaaaaaaaaaaaaaaaab')",
    "Promise.all([",
    "0x",
    "1e400",
    "null",
    "undefined",
];

/// Outcomes a script may end in. `internal_error` and `session_discarded` are not among them:
/// no script text may reach either.
const SCRIPT_KINDS: &[&str] = &[
    "script_error",
    "capability_error",
    "invalid_input",
    "fuel_exhausted",
    "deadline_exceeded",
    "memory_limit",
    "stack_overflow",
    "too_many_calls",
    "result_too_large",
    "logs_too_large",
];

fn scripts(u: &mut Unstructured<'_>, runtime: &tokio::runtime::Runtime) -> Result<(), String> {
    let n = u.int_in_range(1..=40).map_err(|e| e.to_string())?;
    let mut source = String::new();
    for _ in 0..n {
        if u.ratio(1, 8).map_err(|e| e.to_string())? {
            let junk: String = u.arbitrary().map_err(|e| e.to_string())?;
            source.push_str(&junk);
        } else {
            source.push_str(u.choose(FRAGMENTS).map_err(|e| e.to_string())?);
        }
    }
    let limits = SessionLimits {
        fuel: 20_000_000,
        timeout_ms: 2_000,
        memory_bytes: 32 << 20,
        ..SessionLimits::default()
    };
    let report = run_script(runtime, limits, &source)?;
    if let Err(error) = &report.outcome
        && !SCRIPT_KINDS.contains(&error.kind())
    {
        return Err(format!("{source:?} ended as {}: {error}", error.kind()));
    }
    let text = report.to_json().to_string();
    if text.contains('\n') {
        return Err(format!("{source:?}: the report is not one line"));
    }
    let next = run_script(runtime, SessionLimits::default(), "return 41 + 1")?;
    match next.outcome {
        Ok(Some(value)) if value == 42 => Ok(()),
        other => Err(format!(
            "after {source:?} the next session is broken: {other:?}"
        )),
    }
}

// ---- schemas --------------------------------------------------------------------------------

fn draw_schema(u: &mut Unstructured<'_>, depth: u32) -> DrawResult<Value> {
    if depth == 0 || u.ratio(1, 4)? {
        return Ok(match u.int_in_range(0..=9)? {
            0 => json!({"type": "string"}),
            1 => json!({"type": "integer", "minimum": u.int_in_range(-5i64..=5)?}),
            2 => json!({"type": "number"}),
            3 => json!({"type": "boolean"}),
            4 => json!({"type": "null"}),
            5 => json!({"enum": [draw_json(u, 1)?, draw_json(u, 1)?]}),
            6 => json!({"const": draw_json(u, 1)?}),
            7 => {
                json!({"$ref": u.choose(&["#", "#/$defs/a", "#/definitions/b", "other.json", "#anchor", "#/properties/x"])?})
            }
            8 => {
                json!({"type": u.choose(&["string", "object", "array", "bogus", "integer"])?, "format": u.arbitrary::<String>()?})
            }
            _ => draw_json(u, 1)?,
        });
    }
    let mut schema = Map::new();
    let pick = |u: &mut Unstructured<'_>| u.ratio(1, 2);
    if pick(u)? {
        schema.insert(
            "type".into(),
            json!(u.choose(&[
                "object", "array", "string", "integer", "number", "boolean", "null"
            ])?),
        );
    }
    if pick(u)? {
        let mut props = Map::new();
        for _ in 0..u.int_in_range(0..=3)? {
            let name: String = if u.ratio(1, 2)? {
                u.choose(&["a", "b", "x", "0", "__proto__", "with space", "é"])?
                    .to_string()
            } else {
                u.arbitrary()?
            };
            props.insert(name, draw_schema(u, depth - 1)?);
        }
        schema.insert("properties".into(), Value::Object(props));
    }
    if pick(u)? {
        schema.insert(
            "required".into(),
            json!([u.choose(&["a", "b", "x", "missing"])?]),
        );
    }
    if u.ratio(1, 3)? {
        schema.insert("items".into(), draw_schema(u, depth - 1)?);
    }
    if u.ratio(1, 4)? {
        let key = u.choose(&["anyOf", "oneOf", "allOf"])?;
        let parts = (0..u.int_in_range(0..=3)?)
            .map(|_| draw_schema(u, depth - 1))
            .collect::<DrawResult<Vec<_>>>()?;
        schema.insert((*key).into(), Value::Array(parts));
    }
    if u.ratio(1, 4)? {
        let extra = if u.ratio(1, 2)? {
            Value::Bool(u.arbitrary()?)
        } else {
            draw_schema(u, depth - 1)?
        };
        schema.insert("additionalProperties".into(), extra);
    }
    if u.ratio(1, 5)? {
        schema.insert("$defs".into(), json!({"a": draw_schema(u, depth - 1)?}));
    }
    if u.ratio(1, 6)? {
        schema.insert(
            "pattern".into(),
            json!(u.choose(&["^a+$", "(", "[", "\\d{2,}", "(?<n>x)", ".*"])?),
        );
    }
    if u.ratio(1, 6)? {
        schema.insert("description".into(), json!(u.arbitrary::<String>()?));
    }
    if u.ratio(1, 8)? {
        schema.insert(u.arbitrary::<String>()?, draw_json(u, 2)?);
    }
    Ok(Value::Object(schema))
}

fn schemas(u: &mut Unstructured<'_>, _runtime: &tokio::runtime::Runtime) -> Result<(), String> {
    let mut schema = draw_schema(u, 4).map_err(|e| e.to_string())?;
    if u.ratio(3, 4).map_err(|e| e.to_string())?
        && let Value::Object(map) = &mut schema
    {
        map.insert("type".into(), json!("object"));
    }
    let output = draw_schema(u, 3).map_err(|e| e.to_string())?;
    let text = json!({"capabilities": [{"id": "fuzz.target", "input_schema": schema, "output_schema": output}]})
        .to_string();
    if std::env::var_os("CORRAL_FUZZ_TRACE").is_some() {
        eprintln!("fuzz schemas: catalog {text}");
    }
    let catalog = match Catalog::from_json_str(&text) {
        Ok(catalog) => catalog,
        Err(error) => {
            return if error.to_string().is_empty() {
                Err(format!("{text}: an empty error"))
            } else {
                Ok(())
            };
        }
    };
    match render_typescript(&catalog) {
        Ok(rendered) if rendered.contains("fuzz") || rendered.contains("Fuzz") => {}
        Ok(rendered) => {
            return Err(format!(
                "{text}: rendered without the capability: {rendered}"
            ));
        }
        Err(error) => {
            let message = error.to_string();
            if !message.contains("fuzz.target") {
                return Err(format!("{text}: the error does not say where: {message}"));
            }
        }
    }
    let _ = render_prompt(&catalog);
    for _ in 0..4 {
        let instance = draw_json(u, 3).map_err(|e| e.to_string())?;
        let _ = catalog.validate_input(0, &instance);
    }
    Ok(())
}

// ---- the catalog parser ---------------------------------------------------------------------

const SEED_CATALOGS: &[&str] = &[
    r#"{"capabilities": [{"id": "a.b", "description": "d", "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}, "examples": [{"input": {"x": "1"}}]}]}"#,
    r#"{"tools": [{"name": "read_file", "description": "Read", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}, "outputSchema": {"type": "object"}}]}"#,
];

fn catalog_parser(
    u: &mut Unstructured<'_>,
    _runtime: &tokio::runtime::Runtime,
) -> Result<(), String> {
    let mut bytes: Vec<u8> = if u.ratio(1, 5).map_err(|e| e.to_string())? {
        u.arbitrary().map_err(|e| e.to_string())?
    } else {
        u.choose(SEED_CATALOGS)
            .map_err(|e| e.to_string())?
            .as_bytes()
            .to_vec()
    };
    for _ in 0..u.int_in_range(0..=6).map_err(|e| e.to_string())? {
        if bytes.is_empty() {
            break;
        }
        let at = u
            .int_in_range(0..=bytes.len() - 1)
            .map_err(|e| e.to_string())?;
        match u.int_in_range(0..=3).map_err(|e| e.to_string())? {
            0 => bytes[at] = u.arbitrary().map_err(|e| e.to_string())?,
            1 => {
                bytes.remove(at);
            }
            2 => {
                let piece = u
                    .choose(&[
                        "{",
                        "}",
                        "[",
                        "]",
                        "\"",
                        ",",
                        ":",
                        "null",
                        "\"id\"",
                        "\"$ref\": \"#\"",
                        "1e999",
                        "\"\\ud800\"",
                    ])
                    .map_err(|e| e.to_string())?;
                bytes.splice(at..at, piece.bytes());
            }
            _ => bytes.truncate(at),
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    for namespace in [None, Some("ns"), Some("")] {
        if let Ok(catalog) = Catalog::from_any_json_str(&text, namespace) {
            let _ = render_typescript(&catalog);
            let _ = render_prompt(&catalog);
        }
    }
    Ok(())
}

// ---- rendered TypeScript against the validator ----------------------------------------------

/// Instances that often fit `schema`: built from its keywords (following local `$ref`s), with
/// a mutation now and then so that near misses are judged too.
fn draw_instance(
    u: &mut Unstructured<'_>,
    schema: &Value,
    root: &Value,
    depth: u32,
) -> DrawResult<Value> {
    if depth == 0 || u.ratio(1, 10)? {
        return draw_json(u, depth.min(2));
    }
    let Value::Object(object) = schema else {
        return draw_json(u, 1);
    };
    if let Some(Value::String(reference)) = object.get("$ref")
        && let Some(target) = reference.strip_prefix('#').and_then(|p| root.pointer(p))
        && u.ratio(3, 4)?
    {
        return draw_instance(u, target, root, depth - 1);
    }
    if let Some(value) = object.get("const") {
        return Ok(value.clone());
    }
    if let Some(Value::Array(values)) = object.get("enum")
        && !values.is_empty()
    {
        return Ok(u.choose(values)?.clone());
    }
    for keyword in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(members)) = object.get(keyword)
            && !members.is_empty()
            && u.ratio(1, 2)?
        {
            let member = u.choose(members)?;
            return draw_instance(u, member, root, depth - 1);
        }
    }
    let type_name = match object.get("type") {
        Some(Value::String(name)) => name.clone(),
        Some(Value::Array(names)) if !names.is_empty() => {
            u.choose(names)?.as_str().unwrap_or("null").to_string()
        }
        _ if object.contains_key("properties") => "object".into(),
        _ if object.contains_key("items") || object.contains_key("prefixItems") => "array".into(),
        _ => return draw_json(u, 2),
    };
    Ok(match type_name.as_str() {
        "string" => Value::String(u.arbitrary()?),
        "integer" => Value::from(u.int_in_range(-10i64..=10)?),
        "number" => json!(u.int_in_range(-100i64..=100)? as f64 / 4.0),
        "boolean" => Value::Bool(u.arbitrary()?),
        "null" => Value::Null,
        "array" => {
            let n = u.int_in_range(0..=3)?;
            let mut items = Vec::new();
            for i in 0..n {
                let item_schema = match (object.get("prefixItems"), object.get("items")) {
                    (Some(Value::Array(prefix)), _) if i < prefix.len() => prefix[i].clone(),
                    (None, Some(Value::Array(prefix))) if i < prefix.len() => prefix[i].clone(),
                    (_, Some(items @ (Value::Object(_) | Value::Bool(_)))) => items.clone(),
                    _ => json!({}),
                };
                items.push(draw_instance(u, &item_schema, root, depth - 1)?);
            }
            Value::Array(items)
        }
        _ => {
            let mut map = Map::new();
            if let Some(Value::Object(properties)) = object.get("properties") {
                for (name, property) in properties {
                    if u.ratio(3, 4)? {
                        map.insert(name.clone(), draw_instance(u, property, root, depth - 1)?);
                    }
                }
            }
            if u.ratio(1, 4)? {
                let key = u.choose(&["a", "b", "x", "missing", "extra"])?.to_string();
                map.insert(key, draw_json(u, 1)?);
            }
            Value::Object(map)
        }
    })
}

/// Adds the `type` the renderer infers for a schema without one (`object` for object keywords,
/// `array` for array keywords) to every subschema, so the validator judges what the rendered
/// type says (the documented exception to "TypeScript is never narrower than the schema").
fn with_inferred_types(schema: &Value) -> Value {
    let Value::Object(object) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (keyword, value) in object {
        let value = match (keyword.as_str(), value) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                Value::Object(
                    map.iter()
                        .map(|(k, v)| (k.clone(), with_inferred_types(v)))
                        .collect(),
                )
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(list)) => {
                Value::Array(list.iter().map(with_inferred_types).collect())
            }
            ("items" | "additionalProperties" | "additionalItems", Value::Object(_)) => {
                with_inferred_types(value)
            }
            _ => value.clone(),
        };
        out.insert(keyword.clone(), value);
    }
    let has = |k: &str| object.contains_key(k);
    if !has("type") && !has("const") && !has("enum") {
        if has("properties") || has("additionalProperties") || has("patternProperties") {
            out.insert("type".into(), json!("object"));
        } else if has("items") || has("prefixItems") {
            out.insert("type".into(), json!("array"));
        }
    }
    Value::Object(out)
}

/// Schemas made only of keywords TypeScript expresses exactly (object types closed with
/// `additionalProperties: false`, no `integer`, formats, bounds or patterns, unions of
/// non-object members only), for which the rendering must accept exactly what the validator
/// accepts.
fn draw_exact_schema(u: &mut Unstructured<'_>, depth: u32) -> DrawResult<Value> {
    let scalar = |u: &mut Unstructured<'_>| -> DrawResult<Value> {
        Ok(match u.int_in_range(0..=3)? {
            0 => Value::String(u.choose(&["a", "b", "", "é\"\\"])?.to_string()),
            1 => Value::from(u.int_in_range(-3i64..=3)?),
            2 => Value::Bool(u.arbitrary()?),
            _ => Value::Null,
        })
    };
    let leaf = |u: &mut Unstructured<'_>| -> DrawResult<Value> {
        Ok(match u.int_in_range(0..=6)? {
            0 => json!({"type": u.choose(&["string", "number", "boolean", "null"])?}),
            1 => json!({"type": ["string", "null"]}),
            2 => json!({"enum": [scalar(u)?, scalar(u)?]}),
            3 => json!({"const": scalar(u)?}),
            4 => json!({"anyOf": [{"type": "string"}, {"const": scalar(u)?}]}),
            5 => json!(u.arbitrary::<bool>()?),
            _ => json!({}),
        })
    };
    if depth == 0 || u.ratio(1, 3)? {
        return leaf(u);
    }
    if u.ratio(1, 4)? {
        return Ok(json!({"type": "array", "items": draw_exact_schema(u, depth - 1)?}));
    }
    let mut properties = Map::new();
    let mut required = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let name = u
            .choose(&["a", "b", "x", "with space", "__proto__"])?
            .to_string();
        if u.ratio(1, 2)? && !required.contains(&json!(name)) {
            required.push(json!(name));
        }
        properties.insert(name, draw_exact_schema(u, depth - 1)?);
    }
    if u.ratio(1, 6)? {
        required.push(json!("undeclared"));
    }
    Ok(
        json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false}),
    )
}

/// Loads a one-capability catalog and renders it; `None` when either refuses the schema (the
/// `schemas` target checks that refusals say where).
fn rendered_input(schema: &Value) -> Result<(Catalog, ts_judge::Declarations), String> {
    let text = json!({"capabilities": [{"id": "fuzz.target", "input_schema": schema}]}).to_string();
    let catalog = Catalog::from_json_str(&text).map_err(|e| e.to_string())?;
    let rendered = render_typescript(&catalog).map_err(|e| e.to_string())?;
    match ts_judge::Declarations::parse(&rendered) {
        Ok(declarations) => Ok((catalog, declarations)),
        Err(error) => panic!("the judge cannot parse this rendering ({error}):\n{rendered}"),
    }
}

fn typescript_agrees(
    u: &mut Unstructured<'_>,
    _runtime: &tokio::runtime::Runtime,
) -> Result<(), String> {
    use ts_judge::Mode;
    let e = |e: arbitrary::Error| e.to_string();
    // Any schema: every instance the validator accepts, the rendered type accepts.
    let mut schema = draw_schema(u, 4).map_err(e)?;
    if let Value::Object(map) = &mut schema {
        if u.ratio(3, 4).map_err(e)? {
            map.insert("type".into(), json!("object"));
        }
        if u.ratio(1, 4).map_err(e)? {
            let property = draw_schema(u, 2).map_err(e)?;
            map.insert("patternProperties".into(), json!({"^x": property}));
        }
        if u.ratio(1, 6).map_err(e)? {
            map.insert("nullable".into(), json!(true));
        }
    }
    if let Ok((_, declarations)) = rendered_input(&schema) {
        let judged = with_inferred_types(&schema);
        let text = json!({"capabilities": [{"id": "fuzz.target", "input_schema": judged}]});
        if let Ok(catalog) = Catalog::from_json_str(&text.to_string()) {
            for _ in 0..8 {
                let instance = draw_instance(u, &schema, &schema, 4).map_err(e)?;
                let valid = catalog.validate_input(0, &instance).is_ok();
                let typed = declarations.accepts("FuzzTargetInput", &instance, Mode::Structural)?;
                // As below: the validator's loose numeric `const` and `enum` are not a finding.
                if valid
                    && !typed
                    && !declarations.accepts(
                        "FuzzTargetInput",
                        &instance,
                        Mode::Structural.like_the_validator(),
                    )?
                {
                    return Err(format!(
                        "the schema {schema} accepts {instance}, its TypeScript does not:\n{}",
                        render_typescript(&catalog).unwrap_or_default()
                    ));
                }
            }
        }
    }
    // Schemas TypeScript expresses exactly: both judge every instance alike.
    let exact = draw_exact_schema(u, 3).map_err(e)?;
    let exact = match exact {
        Value::Object(map) if map.get("type") == Some(&json!("object")) => Value::Object(map),
        other => {
            json!({"type": "object", "properties": {"v": other}, "required": ["v"], "additionalProperties": false})
        }
    };
    let (catalog, declarations) = rendered_input(&exact)
        .map_err(|error| format!("an exact schema did not render: {exact}: {error}"))?;
    for _ in 0..8 {
        let instance = draw_instance(u, &exact, &exact, 4).map_err(e)?;
        let valid = catalog.validate_input(0, &instance).is_ok();
        let typed = declarations.accepts("FuzzTargetInput", &instance, Mode::Literal)?;
        // jsonschema 0.33 takes a number within f64::EPSILON of a numeric `const` or `enum`
        // value as equal (`const: 0` accepts 1e-300); TypeScript's literal types do not.
        let loose = valid
            && declarations.accepts(
                "FuzzTargetInput",
                &instance,
                Mode::Literal.like_the_validator(),
            )?;
        if valid != typed && !loose {
            return Err(format!(
                "the schema {exact} {} {instance}, its TypeScript {}:\n{}",
                if valid { "accepts" } else { "rejects" },
                if typed { "accepts it" } else { "does not" },
                render_typescript(&catalog).unwrap_or_default()
            ));
        }
    }
    Ok(())
}
