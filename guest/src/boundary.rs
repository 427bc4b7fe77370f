//! The JavaScript <-> WIT boundary: every conversion between QuickJS values and the values of
//! the `corral:sandbox` world happens in this file.

use javy::quickjs::{
    self, Array, Ctx, Exception, Function, Object, Persistent, Value, context::EvalOptions,
    object::Property, promise::PromiseState, qjs,
};

use crate::corral::sandbox::host;
use crate::corral::sandbox::types::{
    Binding, CallError, CallValue, Completion, LogLevel, RunState, ScriptError, User,
};
use crate::{PendingCall, SCRIPT_FILE_NAME, with_session};

/// Scripts are evaluated as the body of an async arrow function. The prefix stays on the first
/// line so line numbers in errors match the user's script; columns on line 1 are shifted back
/// by its length in [`script_error`].
const SCRIPT_PREFIX: &str = "(async () => {\"use strict\";";
/// The suffix starts on a new line so a trailing `// comment` in the script cannot swallow it.
/// Its `}` is the last one of the evaluated text: the parser's fence (see [`eval_script`]).
const SCRIPT_SUFFIX: &str = "\n})()";

/// corral's QuickJS patch (`guest/patches/*-wrapper-fence-and-json-limit.patch`): the
/// program's top-level function must end at the input's last `}`, so a script is parsed as a
/// function body that no text inside it can close (`})(); (function(){` is a SyntaxError, not
/// code outside the wrapper).
const JS_EVAL_FLAG_CORRAL_FENCED_BODY: u32 = 1 << 10;

/// JSON nests at most this many arrays and objects deep where it crosses the boundary (call
/// arguments, log fields, results); deeper values are refused with a `TypeError`, because the
/// host's JSON parser stops at a fixed depth (see `wit/sandbox.wit`).
pub(crate) const MAX_JSON_DEPTH: usize = 100;

/// The most bytes of a script error's `name`, `message` and `stack` the guest hands the host:
/// the host's own caps (`corral_sandbox::MAX_ERROR_*_BYTES`), applied here first so that a huge
/// thrown string is never turned into text whole (or copied across the boundary) only to be
/// cut by the host.
const MAX_ERROR_NAME_BYTES: usize = 256;
const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;
const MAX_ERROR_STACK_BYTES: usize = 16 << 10;

/// Source of the helper behind [`capped_text_of`]: a string's length and its first `n` UTF-16
/// units, through `String.prototype.substring` and `Reflect.apply` as they were before any
/// script ran (a script may replace both).
pub(crate) const TEXT_HEAD_SOURCE: &str = "(() => { const substring = String.prototype.substring; const apply = Reflect.apply; return (s, n) => [s.length, s.length > n ? apply(substring, s, [0, n]) : s]; })()";

unsafe extern "C" {
    /// Limits the next `JSON.stringify` to `limit` characters and `max_depth` nested arrays
    /// and objects (0: no limit). The limits are consumed by that call, so stringifications
    /// nested in its `toJSON` calls are not limited.
    fn JS_CorralSetNextJSONLimit(limit: usize, max_depth: i32);
    /// Whether the last limited `JSON.stringify` stopped at its limit (and forgets it).
    fn JS_CorralTakeJSONLimitHit() -> i32;
    /// The current call site's frames, unformatted (an array, or undefined while a stack
    /// trace is being built).
    fn JS_CorralCaptureSite(ctx: *mut qjs::JSContext) -> qjs::JSValue;
    /// A new `Error` whose `stack` shows a site from [`JS_CorralCaptureSite`].
    fn JS_CorralSiteError(ctx: *mut qjs::JSContext, site: qjs::JSValue) -> qjs::JSValue;
    /// Lets a namespace proxy of `tools` answer the names its target holds without its `get`
    /// trap; false if `obj` is not a proxy.
    fn JS_CorralMarkNamespace(ctx: *mut qjs::JSContext, obj: qjs::JSValue) -> bool;
    /// A pending promise without resolving functions, settled by [`JS_CorralSettlePromise`].
    fn JS_CorralNewPromise(ctx: *mut qjs::JSContext) -> qjs::JSValue;
    /// Whether a value is an ordinary object of an object literal's kind; runs no script code.
    fn JS_CorralIsPlainObject(ctx: *mut qjs::JSContext, v: qjs::JSValue) -> bool;
    /// Whether `JSON.stringify(v)` is `{}` without running script code: a plain object that
    /// never had an own property, with no `toJSON` on its prototype.
    fn JS_CorralIsEmptyJSONObject(ctx: *mut qjs::JSContext, v: qjs::JSValue) -> bool;
    /// Leaves the frames of C functions made with `func` out of stack traces and call sites.
    fn JS_CorralHideFrames(func: qjs::JSCFunctionData);
    /// Resolves (or rejects) a promise from [`JS_CorralNewPromise`] as its resolving function
    /// would on its first call; at most once per promise. -1 if `promise` is not a promise.
    fn JS_CorralSettlePromise(
        ctx: *mut qjs::JSContext,
        promise: qjs::JSValue,
        value: qjs::JSValue,
        is_reject: bool,
    ) -> i32;
}

/// Takes ownership of a value a QuickJS call returned, or of its pending exception.
fn owned_value<'js>(ctx: &Ctx<'js>, raw: qjs::JSValue) -> quickjs::Result<Value<'js>> {
    // SAFETY: `raw` was just returned, owned, by a QuickJS call on this context.
    let value = unsafe { Value::from_raw(ctx.clone(), raw) };
    if value.is_exception() {
        Err(quickjs::Error::Exception)
    } else {
        Ok(value)
    }
}

/// Evaluates `source` as the body of the async wrapper function and returns the wrapper's
/// promise. Goes to `JS_Eval` directly because the fence is not an rquickjs option, and
/// because the input is passed with its length (so a NUL byte in a script is just a character
/// the tokenizer refuses with a located `SyntaxError`).
pub(crate) fn eval_script<'js>(ctx: &Ctx<'js>, source: &str) -> quickjs::Result<Value<'js>> {
    let mut wrapped =
        Vec::with_capacity(SCRIPT_PREFIX.len() + source.len() + SCRIPT_SUFFIX.len() + 1);
    wrapped.extend_from_slice(SCRIPT_PREFIX.as_bytes());
    wrapped.extend_from_slice(source.as_bytes());
    wrapped.extend_from_slice(SCRIPT_SUFFIX.as_bytes());
    let len = wrapped.len();
    // QuickJS reads one byte past the end; it must be NUL.
    wrapped.push(0);
    let flags = qjs::JS_EVAL_TYPE_GLOBAL
        | qjs::JS_EVAL_FLAG_BACKTRACE_BARRIER
        | JS_EVAL_FLAG_CORRAL_FENCED_BODY;
    // SAFETY: the context is alive for 'js; the input is `len` bytes followed by a NUL, and the
    // file name is a C string literal. `JS_Eval` returns an owned value, which `from_raw` takes.
    let raw = unsafe {
        qjs::JS_Eval(
            ctx.as_raw().as_ptr(),
            wrapped.as_ptr().cast(),
            len as _,
            c"script.js".as_ptr(),
            flags as i32,
        )
    };
    owned_value(ctx, raw)
}

/// A JavaScript string as Rust text. Lone UTF-16 surrogates (which QuickJS hands out as
/// three-byte WTF-8 sequences) become U+FFFD, as they do in results, so no string a script
/// makes is lost or turned into an error at the boundary.
pub(crate) fn text_of(string: &quickjs::String<'_>) -> String {
    let Ok(cstring) = string.clone().to_cstring() else {
        return String::new();
    };
    // SAFETY: `as_ptr` points at `len` bytes owned by `cstring`, which outlives the slice.
    let bytes = unsafe { std::slice::from_raw_parts(cstring.as_ptr().cast::<u8>(), cstring.len()) };
    wtf8_to_text(bytes)
}

/// WTF-8 to UTF-8, with U+FFFD for each encoded surrogate.
fn wtf8_to_text(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_string();
    }
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(text) => {
                out.push_str(text);
                break;
            }
            Err(error) => {
                let valid = error.valid_up_to();
                out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                let after = &rest[valid..];
                // A surrogate is ED A0..BF 80..BF; anything else invalid (which QuickJS never
                // produces) is skipped a byte at a time.
                let skip = if after.len() >= 3
                    && after[0] == 0xED
                    && (0xA0..=0xBF).contains(&after[1])
                    && (0x80..=0xBF).contains(&after[2])
                {
                    3
                } else {
                    error.error_len().unwrap_or(after.len()).max(1)
                };
                out.push('\u{FFFD}');
                rest = &after[skip.min(after.len())..];
            }
        }
    }
    out
}

/// Cuts `text` to at most `max` bytes (on a character boundary), ending it with `note`.
fn cut_with_note(mut text: String, max: usize, note: &str) -> String {
    let mut cut = max.saturating_sub(note.len()).min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(note);
    text
}

/// A JavaScript string as text of at most `max` bytes, cut visibly as the host cuts (the
/// host's `... [truncated: N bytes in all]` when the whole string was turned into text).
/// A string longer than `max` UTF-16 units is longer than `max` bytes, so only its first `max`
/// units are turned into text, and the note counts UTF-16 code units: counting its bytes would
/// mean encoding all of it, which is what the cap avoids.
fn capped_text_of<'js>(ctx: &Ctx<'js>, string: &quickjs::String<'js>, max: usize) -> String {
    let head = with_session(|session| session.text_head.clone())
        .and_then(|helper| helper.restore(ctx).ok())
        .and_then(|helper| helper.call::<_, Array>((string.clone(), max as u32)).ok())
        .and_then(|pair| {
            let units: f64 = pair.get(0).ok()?;
            let head: quickjs::String = pair.get(1).ok()?;
            Some((units as u64, head))
        });
    let Some((units, head)) = head else {
        let _ = ctx.catch();
        return cut_with_note(text_of(string), max, "... [truncated]");
    };
    let text = text_of(&head);
    if units as usize > max {
        cut_with_note(
            text,
            max,
            &format!("... [truncated: {units} UTF-16 code units in all]"),
        )
    } else if text.len() > max {
        let note = format!("... [truncated: {} bytes in all]", text.len());
        cut_with_note(text, max, &note)
    } else {
        text
    }
}

/// JSON text with each `\uD800`-`\uDFFF` escape that is not half of a pair replaced by U+FFFD
/// itself (`JSON.stringify` escapes lone surrogates; everywhere else they are shown as U+FFFD).
fn replace_lone_surrogate_escapes(text: &str) -> String {
    let bytes = text.as_bytes();
    let escape_at = |i: usize| -> Option<u16> {
        if bytes.get(i) == Some(&b'\\') && bytes.get(i + 1) == Some(&b'u') {
            u16::from_str_radix(text.get(i + 2..i + 6)?, 16).ok()
        } else {
            None
        }
    };
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escape_at(i) else {
            // Any other escape (`\\` among them): the backslash and the escaped character.
            i += 2;
            continue;
        };
        match unit {
            0xD800..=0xDBFF
                if escape_at(i + 6).is_some_and(|next| (0xDC00..=0xDFFF).contains(&next)) =>
            {
                i += 12;
            }
            0xD800..=0xDFFF => {
                out.push_str(&text[copied..i]);
                out.push('\u{FFFD}');
                i += 6;
                copied = i;
            }
            _ => i += 6,
        }
    }
    out.push_str(&text[copied.min(text.len())..]);
    out
}

/// Whether JSON text nests arrays and objects more than `max` deep. Counts brackets outside
/// strings; the text is `JSON.stringify` output, so it is well formed.
pub(crate) fn json_deeper_than(text: &str, max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for byte in text.bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A data property that is writable, enumerable and configurable: defining it (unlike
/// assigning it) never runs a setter a script put on `Object.prototype` or `Array.prototype`.
fn define<'js, K: quickjs::IntoAtom<'js>, V: quickjs::IntoJs<'js>>(
    object: &Object<'js>,
    key: K,
    value: V,
) -> quickjs::Result<()> {
    object.prop(
        key,
        Property::from(value).writable().enumerable().configurable(),
    )
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

/// `callNative(binding, input)`: [`start_call`], for the prelude's own check of an argument
/// the binding's function did not take its fast path for (see [`bind_native`]).
pub(crate) fn call_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, binding: u32, input: Value<'js>| -> quickjs::Result<Value<'js>> {
            start_call(&ctx, binding, input)
        },
    )
}

/// `bindNative(binding, check)`: the function behind one `tools.*` path, a C function (no
/// JavaScript frame, no `arguments` object). With no argument, `undefined`, or a plain object
/// (`JS_CorralIsPlainObject`, which runs no script code) it starts the call itself; any other
/// arguments go to `check`, the prelude's function that rejects them with the reason, or starts
/// the call through `callNative` if they are fine after all (an `arguments` object, a proxy of
/// a plain object). Its frames are left out of stack traces, so a call's site and an error's
/// stack show the script's frames.
pub(crate) fn bind_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    // SAFETY: only records the function's address.
    unsafe { JS_CorralHideFrames(Some(binding_function)) };
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, binding: u32, check: Function<'js>| -> quickjs::Result<Value<'js>> {
            // The index in a value, not in the function's `magic` (16 bits).
            let index = Value::new_int(ctx.clone(), binding as i32);
            let mut data = [check.as_raw(), index.as_raw()];
            // SAFETY: the context is alive for 'js; `data` is copied (and its values duplicated)
            // by QuickJS before the call returns.
            let function = unsafe {
                qjs::JS_NewCFunctionData(
                    ctx.as_raw().as_ptr(),
                    Some(binding_function),
                    1,
                    0,
                    2,
                    data.as_mut_ptr(),
                )
            };
            owned_value(&ctx, function)
        },
    )
}

/// The body of every function [`bind_native`] makes: `data` holds the prelude's check and the
/// binding's index.
unsafe extern "C" fn binding_function(
    ctx: *mut qjs::JSContext,
    this: qjs::JSValue,
    argc: std::ffi::c_int,
    argv: *mut qjs::JSValue,
    _magic: std::ffi::c_int,
    data: *mut qjs::JSValue,
) -> qjs::JSValue {
    // SAFETY: QuickJS calls this with a live context, `argc` values at `argv` and the two
    // values this function was made with at `data`.
    unsafe {
        let first = if argc > 0 { *argv } else { qjs::JS_UNDEFINED };
        let fast = argc <= 1 && (qjs::JS_IsUndefined(first) || JS_CorralIsPlainObject(ctx, first));
        if !fast {
            return qjs::JS_Call(ctx, *data, this, argc, argv);
        }
        let Some(raw) = std::ptr::NonNull::new(ctx) else {
            return qjs::JS_EXCEPTION;
        };
        let ctx = Ctx::from_raw(raw);
        let binding = qjs::JS_VALUE_GET_INT(*data.add(1)) as u32;
        let started = if qjs::JS_IsUndefined(first)
            || JS_CorralIsEmptyJSONObject(ctx.as_raw().as_ptr(), first)
        {
            // No argument is `{}`, whose text is known without making the object; so is an
            // empty object's, without going through `JSON.stringify`.
            start_call_with_json(&ctx, binding, "[{}]".to_string())
        } else {
            let input =
                Value::from_raw(ctx.clone(), qjs::JS_DupValue(ctx.as_raw().as_ptr(), first));
            start_call(&ctx, binding, input)
        };
        match started {
            Ok(promise) => {
                let raw = qjs::JS_DupValue(ctx.as_raw().as_ptr(), promise.as_raw());
                drop(promise);
                raw
            }
            // Every failure rejects, never throws, as for the prelude's check.
            Err(_) => rejected_with_exception(&ctx),
        }
    }
}

/// A promise rejected with the pending exception (which it clears).
fn rejected_with_exception(ctx: &Ctx<'_>) -> qjs::JSValue {
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: the context is alive; each value is owned once and freed once.
    unsafe {
        let error = qjs::JS_GetException(raw);
        let promise = JS_CorralNewPromise(raw);
        if !qjs::JS_IsException(promise) {
            JS_CorralSettlePromise(raw, promise, error, true);
        }
        qjs::JS_FreeValue(raw, error);
        promise
    }
}

/// Serializes a call's argument, registers its pending promise and tells the host to start it;
/// returns the promise.
fn start_call<'js>(ctx: &Ctx<'js>, binding: u32, input: Value<'js>) -> quickjs::Result<Value<'js>> {
    let Some(input_json) = ctx.json_stringify(input)? else {
        return Err(Exception::throw_type(
            ctx,
            "the argument cannot be serialized as JSON",
        ));
    };
    let input_json = text_of(&input_json);
    // The argument array adds a level.
    if json_deeper_than(&input_json, MAX_JSON_DEPTH - 1) {
        return Err(Exception::throw_type(
            ctx,
            &format!(
                "the argument nests more than {} arrays and objects deep",
                MAX_JSON_DEPTH - 1
            ),
        ));
    }
    // The positional argument array, without building a JavaScript array for it (nor
    // going through `format!`, which costs a call's worth of fuel here).
    let mut args_json = String::with_capacity(input_json.len() + 2);
    args_json.push('[');
    args_json.push_str(&input_json);
    args_json.push(']');
    start_call_with_json(ctx, binding, args_json)
}

/// [`start_call`] once the positional argument array's JSON text is known.
fn start_call_with_json<'js>(
    ctx: &Ctx<'js>,
    binding: u32,
    args_json: String,
) -> quickjs::Result<Value<'js>> {
    // The frames are kept now, so that a rejection's stack points at the script line
    // that made the call rather than at the host's completion; the stack text is made
    // only if the call fails.
    // SAFETY: the context is alive for 'js.
    let site = owned_value(ctx, unsafe { JS_CorralCaptureSite(ctx.as_raw().as_ptr()) })?;
    // The guest settles the promise itself (`settle`), once, so it needs no resolving
    // functions.
    // SAFETY: the context is alive for 'js.
    let promise = owned_value(ctx, unsafe { JS_CorralNewPromise(ctx.as_raw().as_ptr()) })?;
    let call_id = with_session(|session| {
        let call_id = session.next_call_id;
        session.next_call_id = session.next_call_id.wrapping_add(1);
        call_id
    });
    match host::start_call(call_id, binding, &args_json) {
        // Answered at start: settled now, never pending.
        Some(outcome) => settle(ctx, binding, &promise, &site, outcome),
        None => with_session(|session| {
            session.pending.push(PendingCall {
                call_id,
                binding,
                promise: Persistent::save(ctx, promise.clone()),
                site: Persistent::save(ctx, site),
            })
        }),
    }
    Ok(promise)
}

/// The native behind `console.*` and `log(...)`: the prelude passes the level's index, the
/// formatted message and the fields' JSON text (an object, or undefined).
pub(crate) fn log_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>,
         level: u32,
         message: quickjs::String<'js>,
         fields: Option<quickjs::String<'js>>|
         -> quickjs::Result<()> {
            let level = match level {
                0 => LogLevel::Debug,
                1 => LogLevel::Info,
                2 => LogLevel::Warn,
                _ => LogLevel::Error,
            };
            let fields = fields.map(|fields| text_of(&fields));
            if let Some(fields) = &fields
                && json_deeper_than(fields, MAX_JSON_DEPTH)
            {
                return Err(Exception::throw_type(
                    &ctx,
                    &format!(
                        "log(level, message, fields): fields nest more than {MAX_JSON_DEPTH} arrays and objects deep"
                    ),
                ));
            }
            host::log(level, &text_of(&message), fields.as_deref());
            Ok(())
        },
    )
}

/// The native `console.*` passes an argument's `JSON.stringify` text through: each lone
/// surrogate's `\uD800`-style escape becomes U+FFFD, as in results and errors.
pub(crate) fn shown_json_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(ctx.clone(), |text: quickjs::String<'js>| -> String {
        replace_lone_surrogate_escapes(&text_of(&text))
    })
}

/// What a name under one of `tools`' namespaces is bound to.
#[derive(Clone, Copy)]
pub(crate) enum ToolsEntry {
    /// The function of the binding with this index.
    Function(u32),
    /// The namespace node with this index, first claimed by this binding.
    Namespace { node: u32, first_binding: u32 },
}

/// The namespaces under `tools` (node 0 is `tools` itself), resolved once at `init` so that the
/// prelude can build each namespace and function the first time a script reaches it: a
/// capability the script never touches costs nothing in the realm.
#[derive(Default)]
pub(crate) struct ToolsTree {
    /// Each node's names in binding order (the order enumeration reports them in) and an index
    /// into them.
    nodes: Vec<ToolsNode>,
    /// Each binding's canonical id, by binding index.
    ids: Vec<String>,
}

#[derive(Default)]
struct ToolsNode {
    names: Vec<(String, ToolsEntry)>,
    index: std::collections::HashMap<String, usize>,
}

impl ToolsTree {
    /// The entry bound at `name` in namespace `node`.
    pub(crate) fn entry(&self, node: u32, name: &str) -> Option<ToolsEntry> {
        let node = self.nodes.get(node as usize)?;
        node.index.get(name).map(|&at| node.names[at].1)
    }

    /// The names of namespace `node`, in binding order.
    pub(crate) fn names(&self, node: u32) -> impl Iterator<Item = &str> {
        self.nodes
            .get(node as usize)
            .into_iter()
            .flat_map(|node| node.names.iter().map(|(name, _)| name.as_str()))
    }

    /// The canonical id of binding `index`.
    pub(crate) fn id(&self, index: u32) -> Option<&str> {
        self.ids.get(index as usize).map(String::as_str)
    }

    fn insert(&mut self, node: u32, name: &str, entry: ToolsEntry) {
        let node = &mut self.nodes[node as usize];
        node.index.insert(name.to_string(), node.names.len());
        node.names.push((name.to_string(), entry));
    }

    /// Binds `index` at `path`, creating the namespaces on the way; refuses a path that runs
    /// through a function or lands on a name another binding holds.
    fn claim(&mut self, path: &[String], index: u32, id: &str) -> Result<(), String> {
        let mut node = 0u32;
        for (depth, part) in path.iter().enumerate() {
            let last = depth + 1 == path.len();
            match (self.entry(node, part), last) {
                (Some(ToolsEntry::Function(other)), false) => {
                    return Err(format!(
                        "capability {id}: its path runs through capability #{other}'s function"
                    ));
                }
                (Some(ToolsEntry::Namespace { node: next, .. }), false) => node = next,
                (None, false) => {
                    let next = self.nodes.len() as u32;
                    self.nodes.push(ToolsNode::default());
                    let entry = ToolsEntry::Namespace {
                        node: next,
                        first_binding: index,
                    };
                    self.insert(node, part, entry);
                    node = next;
                }
                // Only the same function may be bound twice at one place (its id and its path).
                (Some(ToolsEntry::Function(other)), true) if other == index => {}
                (Some(ToolsEntry::Function(other)), true)
                | (
                    Some(ToolsEntry::Namespace {
                        first_binding: other,
                        ..
                    }),
                    true,
                ) => {
                    return Err(format!(
                        "capability {id}: {} is already taken by capability #{other}",
                        path.join(".")
                    ));
                }
                (None, true) => self.insert(node, part, ToolsEntry::Function(index)),
            }
        }
        Ok(())
    }
}

/// Resolves each binding's JS path (none means the id split on `.`) into the tree under
/// `tools`, refusing bindings that would collide: a path that is a prefix of another, two
/// bindings at one path, or a canonical id (`tools["a.b"]`) that lands on another binding's path.
pub(crate) fn resolve_bindings(bindings: Vec<Binding>) -> Result<ToolsTree, String> {
    let mut tree = ToolsTree {
        nodes: vec![ToolsNode::default()],
        ids: Vec::with_capacity(bindings.len()),
    };
    for (index, binding) in bindings.into_iter().enumerate() {
        let index = index as u32;
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
        tree.claim(&path, index, &binding.id)?;
        if path.len() != 1 || path[0] != binding.id {
            tree.claim(std::slice::from_ref(&binding.id), index, &binding.id)?;
        }
        tree.ids.push(binding.id);
    }
    Ok(tree)
}

/// A JavaScript string as Rust text, or `None` when it holds a lone surrogate (so it cannot
/// name anything the host bound).
fn exact_text_of(string: &quickjs::String<'_>) -> Option<String> {
    let cstring = string.clone().to_cstring().ok()?;
    // SAFETY: as in `text_of`.
    let bytes = unsafe { std::slice::from_raw_parts(cstring.as_ptr().cast::<u8>(), cstring.len()) };
    std::str::from_utf8(bytes).ok().map(str::to_string)
}

/// The natives behind the lazily built `tools` (see `prelude.js`), in the order the prelude
/// takes them: `toolsEntry(node, name)` is `undefined`, `[0, binding, id]` for a function or
/// `[1, node]` for a namespace; `toolsNames(node)` lists a namespace's names in binding order;
/// `markNamespace(proxy)` is called on each namespace proxy the prelude makes (see
/// `JS_CorralMarkNamespace` in the `namespace-get-fast-path` patch).
pub(crate) fn tools_natives<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Vec<Function<'js>>> {
    let entry = Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, node: u32, name: quickjs::String<'js>| -> quickjs::Result<Value<'js>> {
            let Some(name) = exact_text_of(&name) else {
                return Ok(Value::new_undefined(ctx));
            };
            let found = with_session(|session| {
                session.tools.entry(node, &name).map(|entry| match entry {
                    ToolsEntry::Function(index) => {
                        (0u32, index, session.tools.id(index).map(str::to_string))
                    }
                    ToolsEntry::Namespace { node, .. } => (1, node, None),
                })
            });
            let Some((kind, number, id)) = found else {
                return Ok(Value::new_undefined(ctx));
            };
            let entry = Array::new(ctx.clone())?;
            define(&entry, 0u32, kind)?;
            define(&entry, 1u32, number)?;
            if let Some(id) = id {
                define(&entry, 2u32, id.as_str())?;
            }
            Ok(entry.into_value())
        },
    )?;
    let names = Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>, node: u32| -> quickjs::Result<Array<'js>> {
            let list = Array::new(ctx.clone())?;
            let names: Vec<String> =
                with_session(|session| session.tools.names(node).map(str::to_string).collect());
            for (i, name) in names.iter().enumerate() {
                define(&list, i as u32, name.as_str())?;
            }
            Ok(list)
        },
    )?;
    let mark_namespace = Function::new(ctx.clone(), |ctx: Ctx<'js>, proxy: Value<'js>| -> bool {
        // SAFETY: the context and the value are alive for 'js; the call only sets a flag.
        unsafe { JS_CorralMarkNamespace(ctx.as_raw().as_ptr(), proxy.as_raw()) }
    })?;
    Ok(vec![entry, names, mark_namespace])
}

/// The native behind the lazily built `user`.
pub(crate) fn session_native<'js>(ctx: &Ctx<'js>) -> quickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>| -> quickjs::Result<Value<'js>> {
            let (initialized, user) =
                with_session(|session| (session.initialized, session.user.clone()));
            if !initialized {
                return Err(Exception::throw_internal(
                    &ctx,
                    "user was read before session.init",
                ));
            }
            user_to_js(&ctx, user.as_ref())
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
    define(&object, "id", user.id.as_str())?;
    define(&object, "email", text_or_null(user.email.as_deref())?)?;
    define(
        &object,
        "displayName",
        text_or_null(user.display_name.as_deref())?,
    )?;
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
            Some(session.pending.swap_remove(position))
        });
        // A completion for an unknown call is a host bug; ignoring it keeps the script's
        // promises consistent (the host's own accounting reports it).
        let Some(call) = pending else {
            continue;
        };
        let PendingCall {
            binding,
            promise,
            site,
            ..
        } = call;
        let (Ok(promise), Ok(site)) = (promise.restore(ctx), site.restore(ctx)) else {
            let _ = ctx.catch();
            continue;
        };
        settle(ctx, binding, &promise, &site, completion.outcome);
    }
}

/// Settles a call's promise with its outcome: the parsed value, the text, or an `Error` whose
/// stack is the call's site. Each call is settled once: a call answered at start never becomes
/// pending, and a delivered one leaves `pending` first.
fn settle<'js>(
    ctx: &Ctx<'js>,
    binding: u32,
    promise: &Value<'js>,
    site: &Value<'js>,
    outcome: Result<CallValue, CallError>,
) {
    // Only a rejection names the capability.
    let capability = |binding: u32| {
        with_session(|session| session.tools.id(binding).map(str::to_string)).unwrap_or_default()
    };
    let settle_with = |value: Value<'_>, is_reject: bool| -> quickjs::Result<()> {
        // SAFETY: the context is alive; both values are borrowed for the call.
        let settled = unsafe {
            JS_CorralSettlePromise(
                ctx.as_raw().as_ptr(),
                promise.as_raw(),
                value.as_raw(),
                is_reject,
            )
        };
        if settled < 0 {
            return Err(quickjs::Error::Unknown);
        }
        Ok(())
    };
    let reject = |name: &str, message: &str, tool_call_id: &str| -> quickjs::Result<()> {
        // SAFETY: the context is alive; `site` is borrowed for the call.
        let error = owned_value(ctx, unsafe {
            JS_CorralSiteError(ctx.as_raw().as_ptr(), site.as_raw())
        })?;
        let Some(error) = error.into_object() else {
            return Err(quickjs::Error::Exception);
        };
        // In the order an `Error` made with its message gets them.
        error.set("message", message)?;
        error.set("name", name)?;
        error.set("capability", capability(binding).as_str())?;
        error.set("toolCallId", tool_call_id)?;
        settle_with(error.into_value(), true)
    };
    let settled = match outcome {
        Ok(CallValue::Json(text)) => match text.as_str() {
            // What a tool that acts answers most often, without setting up JSON's parser.
            "null" => settle_with(Value::new_null(ctx.clone()), false),
            "true" | "false" => settle_with(Value::new_bool(ctx.clone(), text == "true"), false),
            _ => match ctx.json_parse(text) {
                Ok(value) => settle_with(value, false),
                Err(_) => {
                    let _ = ctx.catch();
                    let message = format!(
                        "{} returned a result that is not valid JSON",
                        capability(binding)
                    );
                    reject("CapabilityError", &message, "")
                }
            },
        },
        Ok(CallValue::Text(text)) => quickjs::String::from_str(ctx.clone(), &text)
            .and_then(|text| settle_with(text.into_value(), false)),
        Err(error) => reject(&error.name, &error.message, &error.tool_call_id),
    };
    if settled.is_err() {
        // Settling only fails when the engine is out of memory; the host's memory limit
        // reports that, so the pending exception is dropped here.
        let _ = ctx.catch();
    }
}

/// `Some` once the script's promise has settled: `done`, or `result-too-large` when its value's
/// JSON text would pass `max_result_bytes`.
pub(crate) fn settled_result(
    ctx: &Ctx<'_>,
    promise: Persistent<Value<'static>>,
    max_result_bytes: u64,
) -> Option<RunState> {
    let value = match promise.restore(ctx) {
        Ok(value) => value,
        Err(error) => {
            return Some(RunState::Done(Err(plain_error(
                "InternalError",
                &error.to_string(),
            ))));
        }
    };
    // The fence makes the wrapper the whole program, so its value is always its promise.
    let Some(promise) = value.as_promise().cloned() else {
        return Some(RunState::Done(Err(plain_error(
            "InternalError",
            "the script's wrapper did not yield a promise",
        ))));
    };
    match promise.state() {
        PromiseState::Pending => None,
        PromiseState::Resolved => Some(match promise.result::<Value>() {
            Some(Ok(value)) => to_json(ctx, value, max_result_bytes),
            _ => RunState::Done(Err(plain_error(
                "InternalError",
                "a resolved promise has no value",
            ))),
        }),
        PromiseState::Rejected => {
            let _ = promise.result::<Value>();
            Some(RunState::Done(Err(exception_to_script_error(
                ctx,
                ctx.catch(),
            ))))
        }
    }
}

/// Serializes the script's value, stopping as soon as its text would pass `max_result_bytes`
/// (QuickJS counts characters, and every character is at least a byte of JSON text).
fn to_json<'js>(ctx: &Ctx<'js>, value: Value<'js>, max_result_bytes: u64) -> RunState {
    // SAFETY: plain setters of the patched QuickJS's globals; wasm is single-threaded.
    // The depth is checked while serializing too: QuickJS's cycle check is linear in the
    // depth, so a value 100,000 deep would otherwise spend its fuel before the check below.
    unsafe {
        JS_CorralSetNextJSONLimit(
            usize::try_from(max_result_bytes).unwrap_or(usize::MAX),
            MAX_JSON_DEPTH as i32,
        )
    };
    let text = ctx.json_stringify(value);
    // SAFETY: as above; clearing the limit too in case the stringification never started.
    let hit = unsafe {
        let hit = JS_CorralTakeJSONLimitHit() != 0;
        JS_CorralSetNextJSONLimit(0, 0);
        hit
    };
    if hit {
        let _ = ctx.catch();
        return RunState::ResultTooLarge;
    }
    RunState::Done(match text {
        Ok(None) => Ok(None),
        Ok(Some(text)) => {
            let text = text_of(&text);
            if json_deeper_than(&text, MAX_JSON_DEPTH) {
                Err(plain_error(
                    "TypeError",
                    &format!(
                        "the script's value nests more than {MAX_JSON_DEPTH} arrays and objects deep"
                    ),
                ))
            } else {
                Ok(Some(text))
            }
        }
        Err(error) => Err(script_error(ctx, error)),
    })
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
            Some(text) => capped_text_of(ctx, text, MAX_ERROR_MESSAGE_BYTES),
            None => thrown_value_json(ctx, thrown.clone()),
        };
        return plain_error("Error", &message);
    };
    let text = |key: &str, max: usize| -> Option<String> {
        object
            .get::<_, Value>(key)
            .ok()
            .and_then(|v| v.as_string().map(|s| capped_text_of(ctx, s, max)))
    };
    let name = text("name", MAX_ERROR_NAME_BYTES).unwrap_or_else(|| "Error".to_string());
    let message = text("message", MAX_ERROR_MESSAGE_BYTES).unwrap_or_default();
    // `fix_stack` only drops frames and shortens columns, but ends the last line with a
    // newline: one byte is left for it.
    let stack = text("stack", MAX_ERROR_STACK_BYTES - 1).map(|stack| fix_stack(&stack));
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

/// The message for a thrown value that is not an Error: its JSON text, serialized no further
/// than the message cap, with lone surrogates as U+FFFD.
fn thrown_value_json<'js>(ctx: &Ctx<'js>, thrown: Value<'js>) -> String {
    // SAFETY: plain setters of the patched QuickJS's globals; wasm is single-threaded.
    unsafe { JS_CorralSetNextJSONLimit(MAX_ERROR_MESSAGE_BYTES, MAX_JSON_DEPTH as i32) };
    let text = ctx.json_stringify(thrown);
    // SAFETY: as above.
    let hit = unsafe {
        let hit = JS_CorralTakeJSONLimitHit() != 0;
        JS_CorralSetNextJSONLimit(0, 0);
        hit
    };
    match text {
        _ if hit => {
            let _ = ctx.catch();
            format!(
                "a value that is not an Error was thrown... [truncated: the thrown value's JSON text is over {MAX_ERROR_MESSAGE_BYTES} UTF-16 code units]"
            )
        }
        Ok(Some(text)) => {
            let text = replace_lone_surrogate_escapes(&text_of(&text));
            if text.len() > MAX_ERROR_MESSAGE_BYTES {
                let note = format!("... [truncated: {} bytes in all]", text.len());
                cut_with_note(text, MAX_ERROR_MESSAGE_BYTES, &note)
            } else {
                text
            }
        }
        Ok(None) => "a value that is not an Error was thrown".to_string(),
        Err(_) => {
            let _ = ctx.catch();
            "a value that is not an Error was thrown".to_string()
        }
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
