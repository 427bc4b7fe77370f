//! The JavaScript <-> WIT boundary: every conversion between QuickJS values and the values of
//! the `corral:sandbox` world happens in this file.

use javy::quickjs::{
    self, Array, Ctx, Exception, Function, Object, Persistent, Promise, Value,
    context::EvalOptions, promise::PromiseState,
};

use crate::corral::sandbox::host;
use crate::corral::sandbox::types::{Binding, CallValue, Completion, LogLevel, ScriptError, User};
use crate::{PendingCall, SCRIPT_FILE_NAME, with_session};

/// Scripts are evaluated as the body of an async arrow function. The prefix stays on the first
/// line so line numbers in errors match the user's script; columns on line 1 are shifted back
/// by its length in [`script_error`].
const SCRIPT_PREFIX: &str = "(async () => {\"use strict\";";
/// The suffix starts on a new line so a trailing `// comment` in the script cannot swallow it.
const SCRIPT_SUFFIX: &str = "\n})()";

pub(crate) fn wrap_script(source: &str) -> String {
    let mut wrapped =
        String::with_capacity(SCRIPT_PREFIX.len() + source.len() + SCRIPT_SUFFIX.len());
    wrapped.push_str(SCRIPT_PREFIX);
    wrapped.push_str(source);
    wrapped.push_str(SCRIPT_SUFFIX);
    wrapped
}

pub(crate) fn eval_options(file_name: &str) -> EvalOptions {
    let mut options = EvalOptions::default();
    options.global = true;
    options.strict = false;
    options.backtrace_barrier = true;
    options.promise = false;
    options.filename = Some(file_name.to_string());
    options
}

/// Replaces `Math.random` with a xorshift64* generator seeded by the host through
/// `session-config.random-seed`, so scripts are reproducible unless the host grants entropy.
pub(crate) fn install_random(ctx: &Ctx<'_>) -> quickjs::Result<()> {
    let random = Function::new(ctx.clone(), || {
        with_session(|session| {
            let mut x = session.random_state;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            session.random_state = x;
            let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
            bits as f64 / (1u64 << 53) as f64
        })
    })?;
    let math: Object = ctx.globals().get("Math")?;
    math.set("random", random)
}

/// The native behind every `tools.*` function: serializes the one-element argument array,
/// registers a pending promise and tells the host to start the call.
pub(crate) fn call_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, binding: u32, input: Value<'js>| -> quickjs::Result<Promise<'js>> {
            let Some(input_json) = ctx.json_stringify(input)? else {
                return Err(Exception::throw_type(
                    &ctx,
                    "the argument cannot be serialized as JSON",
                ));
            };
            // The positional argument array, without building a JavaScript array for it.
            let args_json = format!("[{}]", input_json.to_string()?);
            // The error a rejection will carry is created now, so its stack points at the
            // script line that made the call rather than at the host's completion.
            let site = Exception::from_message(ctx.clone(), "")?;
            let (promise, resolve, reject) = ctx.promise()?;
            let call_id = with_session(|session| {
                let call_id = session.next_call_id;
                session.next_call_id = session.next_call_id.wrapping_add(1);
                session.pending.push(PendingCall {
                    call_id,
                    binding,
                    resolve: Persistent::save(&ctx, resolve),
                    reject: Persistent::save(&ctx, reject),
                    site: Persistent::save(&ctx, site.into_object()),
                });
                call_id
            });
            host::start_call(call_id, binding, &args_json);
            Ok(promise)
        },
    )
}

/// The native behind `console.*` and `log(...)`.
pub(crate) fn log_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |level: u32, message: String, fields: Option<String>| {
            let level = match level {
                0 => LogLevel::Debug,
                1 => LogLevel::Info,
                2 => LogLevel::Warn,
                _ => LogLevel::Error,
            };
            host::log(level, &message, fields.as_deref());
        },
    )
}

/// Resolves each binding's JS path (none means the id split on `.`) and rejects bindings that
/// would collide under `tools`: a path that is a prefix of another, two bindings at one path,
/// or a canonical id (`tools["a.b"]`) that lands on another binding's path.
pub(crate) fn resolve_bindings(
    bindings: Vec<Binding>,
) -> Result<Vec<(String, Vec<String>)>, String> {
    use std::collections::HashMap;
    let mut resolved = Vec::with_capacity(bindings.len());
    // Every occupied path -> (binding index, whether it is a function or a namespace).
    let mut occupied: HashMap<Vec<String>, (usize, bool)> = HashMap::new();
    let mut claim = |path: Vec<String>, index: usize, id: &str| -> Result<(), String> {
        for end in 1..path.len() {
            match occupied.get(&path[..end]) {
                Some((other, true)) => {
                    return Err(format!(
                        "capability {id}: its path runs through capability #{other}'s function"
                    ));
                }
                Some((_, false)) => {}
                None => {
                    occupied.insert(path[..end].to_vec(), (index, false));
                }
            }
        }
        match occupied.get(&path) {
            // Only the same function may be bound twice at one place (its id and its path).
            Some((other, true)) if *other == index => Ok(()),
            Some((other, _)) => Err(format!(
                "capability {id}: {} is already taken by capability #{other}",
                path.join(".")
            )),
            None => {
                occupied.insert(path, (index, true));
                Ok(())
            }
        }
    };
    for (index, binding) in bindings.into_iter().enumerate() {
        let path: Vec<String> = match binding.js_path {
            Some(path) => path,
            None => binding.id.split('.').map(str::to_string).collect(),
        };
        if path.is_empty() || path.iter().any(String::is_empty) {
            return Err(format!(
                "capability {}: its JS path has an empty part",
                binding.id
            ));
        }
        claim(path.clone(), index, &binding.id)?;
        if path.len() != 1 || path[0] != binding.id {
            claim(vec![binding.id.clone()], index, &binding.id)?;
        }
        resolved.push((binding.id, path));
    }
    Ok(resolved)
}

pub(crate) fn bindings_to_js<'js>(
    ctx: &Ctx<'js>,
    bindings: &[(String, Vec<String>)],
) -> quickjs::Result<Array<'js>> {
    let list = Array::new(ctx.clone())?;
    for (index, (id, js_path)) in bindings.iter().enumerate() {
        let entry = Array::new(ctx.clone())?;
        entry.set(0, id.as_str())?;
        let path = Array::new(ctx.clone())?;
        for (i, part) in js_path.iter().enumerate() {
            path.set(i, part.as_str())?;
        }
        entry.set(1, path)?;
        list.set(index, entry)?;
    }
    Ok(list)
}

/// The native behind the lazily built `tools` and `user`: `[bindings, user]`.
pub(crate) fn session_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>| -> quickjs::Result<Array<'js>> {
            let (initialized, bindings, user) = with_session(|session| {
                (
                    session.initialized,
                    session.bindings.clone(),
                    session.user.clone(),
                )
            });
            if !initialized {
                return Err(Exception::throw_internal(
                    &ctx,
                    "tools and user were read before session.init",
                ));
            }
            let state = Array::new(ctx.clone())?;
            state.set(0, bindings_to_js(&ctx, &bindings)?)?;
            state.set(1, user_to_js(&ctx, user.as_ref())?)?;
            Ok(state)
        },
    )
}

pub(crate) fn user_to_js<'js>(ctx: &Ctx<'js>, user: Option<&User>) -> quickjs::Result<Value<'js>> {
    let Some(user) = user else {
        return Ok(Value::new_null(ctx.clone()));
    };
    // Absent fields are `null`, not `undefined`, so the user serializes with all three keys.
    let text_or_null = |text: Option<&str>| -> quickjs::Result<Value<'js>> {
        match text {
            Some(text) => quickjs::String::from_str(ctx.clone(), text).map(|s| s.into_value()),
            None => Ok(Value::new_null(ctx.clone())),
        }
    };
    let object = Object::new(ctx.clone())?;
    object.set("id", user.id.as_str())?;
    object.set("email", text_or_null(user.email.as_deref())?)?;
    object.set("displayName", text_or_null(user.display_name.as_deref())?)?;
    Ok(object.into_value())
}

/// Settles the promises of the given completions.
pub(crate) fn deliver(ctx: &Ctx<'_>, completions: Vec<Completion>) {
    for completion in completions {
        let pending = with_session(|session| {
            let position = session
                .pending
                .iter()
                .position(|p| p.call_id == completion.call_id)?;
            let call = session.pending.swap_remove(position);
            let id = session
                .bindings
                .get(call.binding as usize)
                .map(|(id, _)| id.clone())
                .unwrap_or_default();
            Some((call, id))
        });
        // A completion for an unknown call is a host bug; ignoring it keeps the script's
        // promises consistent (the host's own accounting reports it).
        let Some((call, capability)) = pending else {
            continue;
        };
        let settle = |call: PendingCall| -> quickjs::Result<()> {
            let reject = |name: &str, message: &str, tool_call_id: &str| -> quickjs::Result<()> {
                let error = call.site.clone().restore(ctx)?;
                error.set("name", name)?;
                error.set("message", message)?;
                error.set("capability", capability.as_str())?;
                error.set("toolCallId", tool_call_id)?;
                call.reject.clone().restore(ctx)?.call::<_, ()>((error,))
            };
            match completion.outcome {
                Ok(CallValue::Json(text)) => match ctx.json_parse(text) {
                    Ok(value) => call.resolve.restore(ctx)?.call::<_, ()>((value,)),
                    Err(_) => {
                        let _ = ctx.catch();
                        let message =
                            format!("{capability} returned a result that is not valid JSON");
                        reject("CapabilityError", &message, "")
                    }
                },
                Ok(CallValue::Text(text)) => call.resolve.restore(ctx)?.call::<_, ()>((text,)),
                Err(error) => reject(&error.name, &error.message, &error.tool_call_id),
            }
        };
        if settle(call).is_err() {
            // Settling only fails when the engine is out of memory; the host's memory limit
            // reports that, so the pending exception is dropped here.
            let _ = ctx.catch();
        }
    }
}

/// `Some` once the script's promise has settled.
pub(crate) fn settled_result(
    ctx: &Ctx<'_>,
    promise: Persistent<Value<'static>>,
) -> Option<Result<Option<String>, ScriptError>> {
    let value = match promise.restore(ctx) {
        Ok(value) => value,
        Err(error) => return Some(Err(plain_error("InternalError", &error.to_string()))),
    };
    // The wrapper always yields a promise; if a script broke out of it, its completion value is
    // taken as the result.
    let Some(promise) = value.as_promise().cloned() else {
        return Some(to_json(ctx, value));
    };
    match promise.state() {
        PromiseState::Pending => None,
        PromiseState::Resolved => Some(match promise.result::<Value>() {
            Some(Ok(value)) => to_json(ctx, value),
            _ => Err(plain_error(
                "InternalError",
                "a resolved promise has no value",
            )),
        }),
        PromiseState::Rejected => {
            let _ = promise.result::<Value>();
            Some(Err(exception_to_script_error(ctx, ctx.catch())))
        }
    }
}

fn to_json<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<Option<String>, ScriptError> {
    match ctx.json_stringify(value) {
        Ok(None) => Ok(None),
        Ok(Some(text)) => text
            .to_string()
            .map(Some)
            .map_err(|e| plain_error("InternalError", &e.to_string())),
        Err(error) => Err(script_error(ctx, error)),
    }
}

pub(crate) fn plain_error(name: &str, message: &str) -> ScriptError {
    ScriptError {
        name: name.to_string(),
        message: message.to_string(),
        stack: None,
        line: None,
        column: None,
    }
}

/// Turns a failed evaluation into a [`ScriptError`], reading the pending exception.
pub(crate) fn script_error(ctx: &Ctx<'_>, error: quickjs::Error) -> ScriptError {
    if error.is_exception() {
        exception_to_script_error(ctx, ctx.catch())
    } else {
        plain_error("InternalError", &error.to_string())
    }
}

fn exception_to_script_error<'js>(ctx: &Ctx<'js>, thrown: Value<'js>) -> ScriptError {
    let Some(object) = thrown.as_object().filter(|o| o.is_error()) else {
        // `throw "text"` or `throw {..}`: not an Error, so there is no name or stack.
        let message = match thrown.as_string() {
            Some(text) => text.to_string().ok(),
            None => ctx
                .json_stringify(thrown.clone())
                .ok()
                .flatten()
                .and_then(|s| s.to_string().ok()),
        }
        .unwrap_or_else(|| "a value that is not an Error was thrown".to_string());
        return plain_error("Error", &message);
    };
    let text = |key: &str| -> Option<String> {
        object
            .get::<_, Value>(key)
            .ok()
            .and_then(|v| v.as_string().and_then(|s| s.to_string().ok()))
    };
    let name = text("name").unwrap_or_else(|| "Error".to_string());
    let message = text("message").unwrap_or_default();
    let stack = text("stack").map(|stack| fix_stack(&stack));
    let (line, column) = stack
        .as_deref()
        .and_then(first_script_location)
        .map_or((None, None), |(line, column)| (Some(line), Some(column)));
    ScriptError {
        name,
        message,
        stack,
        line,
        column,
    }
}

/// Drops the wrapper's and the prelude's frames (they are corral's, not the user's) and rewrites `script.js:1:N` locations so columns on the
/// first line do not count the wrapper.
fn fix_stack(stack: &str) -> String {
    let stack: String = stack
        .lines()
        .filter(|line| {
            let frame = line.trim_start();
            !frame.starts_with("at <eval>") && !frame.contains("(prelude.js:")
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let marker = format!("{SCRIPT_FILE_NAME}:1:");
    let mut out = String::with_capacity(stack.len());
    let mut rest = stack.as_str();
    while let Some(at) = rest.find(&marker) {
        let (before, after) = rest.split_at(at + marker.len());
        out.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        // QuickJS counts columns on the first line from 0 (and from 1 on every later line).
        match after[..digits].parse::<usize>() {
            Ok(column) if column >= SCRIPT_PREFIX.len() => {
                out.push_str(&(column - SCRIPT_PREFIX.len() + 1).to_string());
            }
            Ok(_) => out.push('1'),
            Err(_) => {}
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// The first `script.js:LINE:COLUMN` in a stack trace.
fn first_script_location(stack: &str) -> Option<(u32, u32)> {
    let marker = format!("{SCRIPT_FILE_NAME}:");
    let at = stack.find(&marker)?;
    let rest = &stack[at + marker.len()..];
    let mut parts = rest.splitn(3, |c: char| !c.is_ascii_digit());
    let line = parts.next()?.parse().ok()?;
    let column = parts.next()?.parse().ok()?;
    Some((line, column))
}

/// A readable description of an exception, for errors during set-up.
pub(crate) fn describe_exception(ctx: &Ctx<'_>, error: quickjs::Error) -> String {
    let error = script_error(ctx, error);
    format!("{}: {}", error.name, error.message)
}
