//! Results that fit: a tool result cut to a token budget, keeping its shape.
//!
//! A 5 MB result sent back to the model whole either fails the request or buys nothing; sent
//! as nothing it leaves the model blind. [`fit_to_budget`] keeps what tells the most per token:
//! the same JSON shape, with the *largest* parts cut first. It looks for the largest per-part
//! allowance `n` (in bytes of JSON text) for which cutting every part down to about `n` makes
//! the whole fit, so parts smaller than `n` are left alone:
//!
//! - a string longer than `n` keeps its head and tail, with `…[N chars cut]…` in the middle;
//! - an array longer than `n` keeps its first and last items (as many as fit in `n`, at least
//!   one of each), with a `"…[N of M items cut]…"` element between them;
//! - an object longer than `n` with many keys keeps its first keys (at least
//!   [`MIN_OBJECT_KEYS`]) and a `"…"` key saying how many were cut;
//! - containers deeper than a depth that shrinks with `n` become a marker string such as
//!   `"…[object of 12 keys, 3456 bytes, cut at depth 4]…"`.
//!
//! Sizes are estimated the way compaction estimates them ([`crate::estimate_tokens`]): bytes of
//! JSON text divided by four. The function is pure (the same value and budget always give the
//! same result), so a replayed turn shows the model exactly what the first run showed it.

use serde_json::{Map, Value};

/// The default budget of one tool result, in estimated tokens (about what Cloudflare's
/// connectors keep).
pub const DEFAULT_RESULT_TOKENS: u32 = 6_000;

/// The smallest budget [`fit_to_budget`] honours: below it a cut result could not even say
/// what was cut.
pub const MIN_RESULT_TOKENS: usize = 64;

/// Objects keep at least this many keys however small the allowance: an object with few keys
/// (a script's report, a record) keeps its shape and has its values cut instead.
pub const MIN_OBJECT_KEYS: usize = 8;

/// The smallest per-part allowance tried, in bytes.
const MIN_PART_BYTES: usize = 16;

/// A value cut to a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The value to show (the input itself when it fit).
    pub value: Value,
    /// Bytes of the whole value's JSON text.
    pub whole_bytes: usize,
    /// Whether anything was cut.
    pub cut: bool,
}

/// Estimated tokens of a JSON text of `bytes` bytes (as compaction counts).
pub fn tokens_of_bytes(bytes: usize) -> usize {
    bytes.div_ceil(4)
}

/// Cuts `value` so its JSON text is at most `budget_tokens` estimated tokens (at least
/// [`MIN_RESULT_TOKENS`]), keeping its shape; see the module docs for the rules.
pub fn fit_to_budget(value: &Value, budget_tokens: usize) -> Fitted {
    let budget_bytes = budget_tokens.max(MIN_RESULT_TOKENS) * 4;
    let whole_bytes = json_len(value);
    if whole_bytes <= budget_bytes {
        return Fitted {
            value: value.clone(),
            whole_bytes,
            cut: false,
        };
    }
    // The largest allowance that fits: sizes shrink (nearly) monotonically with the allowance,
    // so a binary search finds it in a few passes over the value.
    let (mut low, mut high) = (MIN_PART_BYTES, whole_bytes);
    let mut best = None;
    while low <= high {
        let middle = low + (high - low) / 2;
        let (candidate, size) = cut(value, middle, 0);
        if size <= budget_bytes {
            best = Some(candidate);
            low = middle + 1;
        } else {
            high = middle - 1;
        }
    }
    let value = best.unwrap_or_else(|| {
        Value::String(format!(
            "…[a {} of {whole_bytes} bytes of JSON, too large to show even in part]…",
            kind_name(value)
        ))
    });
    Fitted {
        value,
        whole_bytes,
        cut: true,
    }
}

/// The deepest container kept whole at allowance `n`: about log2(n/8), at least 1, so a small
/// allowance shows the outline and a large one the detail.
fn depth_limit(n: usize) -> usize {
    ((n / 8).max(2)).ilog2() as usize
}

/// `value` cut at allowance `n`, with the length of its JSON text.
fn cut(value: &Value, n: usize, depth: usize) -> (Value, usize) {
    match value {
        Value::String(text) => cut_string(text, n),
        Value::Array(items) if !items.is_empty() && depth >= depth_limit(n) => {
            depth_marker(value, depth)
        }
        Value::Object(map) if !map.is_empty() && depth >= depth_limit(n) => {
            depth_marker(value, depth)
        }
        Value::Array(items) => cut_array(items, n, depth),
        Value::Object(map) => cut_object(map, n, depth),
        scalar => (scalar.clone(), json_len(scalar)),
    }
}

fn marker(text: String) -> (Value, usize) {
    let value = Value::String(text);
    let size = json_len(&value);
    (value, size)
}

fn depth_marker(value: &Value, depth: usize) -> (Value, usize) {
    let what = match value {
        Value::Array(items) => format!("array of {} items", items.len()),
        Value::Object(map) => format!("object of {} keys", map.len()),
        _ => kind_name(value).to_string(),
    };
    marker(format!(
        "…[{what}, {} bytes, cut at depth {depth}]…",
        json_len(value)
    ))
}

fn cut_string(text: &str, n: usize) -> (Value, usize) {
    let whole = json_len(&Value::String(text.to_owned()));
    // Cutting must save more than the marker costs.
    if whole <= n + 32 {
        return (Value::String(text.to_owned()), whole);
    }
    let keep = n / 2;
    let head_end = floor_boundary(text, keep);
    let tail_start = ceil_boundary(text, text.len().saturating_sub(keep)).max(head_end);
    let cut_chars = text[head_end..tail_start].chars().count();
    marker(format!(
        "{}…[{cut_chars} chars cut]…{}",
        &text[..head_end],
        &text[tail_start..]
    ))
}

fn floor_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

fn cut_array(items: &[Value], n: usize, depth: usize) -> (Value, usize) {
    let cut_items: Vec<(Value, usize)> = items.iter().map(|v| cut(v, n, depth + 1)).collect();
    let total = container_len(cut_items.iter().map(|(_, size)| *size));
    if total <= n || items.len() <= 2 {
        let values = cut_items.into_iter().map(|(v, _)| v).collect();
        return (Value::Array(values), total);
    }
    // First and last items alternately while they fit the allowance; at least one of each.
    let (mut front, mut back) = (0usize, 0usize);
    let mut kept = 0usize;
    while front + back < items.len() {
        let next = if front <= back {
            front
        } else {
            items.len() - 1 - back
        };
        let size = cut_items[next].1 + 1;
        if kept + size > n && front >= 1 && back >= 1 {
            break;
        }
        kept += size;
        if front <= back {
            front += 1;
        } else {
            back += 1;
        }
    }
    let left_out = items.len() - front - back;
    let mut values: Vec<Value> = Vec::with_capacity(front + back + 1);
    let mut sizes = Vec::with_capacity(front + back + 1);
    for (value, size) in cut_items.iter().take(front) {
        values.push(value.clone());
        sizes.push(*size);
    }
    if left_out > 0 {
        let (value, size) = marker(format!("…[{left_out} of {} items cut]…", items.len()));
        values.push(value);
        sizes.push(size);
    }
    for (value, size) in cut_items.iter().skip(items.len() - back) {
        values.push(value.clone());
        sizes.push(*size);
    }
    (Value::Array(values), container_len(sizes.into_iter()))
}

fn cut_object(map: &Map<String, Value>, n: usize, depth: usize) -> (Value, usize) {
    let entries: Vec<(&String, Value, usize)> = map
        .iter()
        .map(|(key, value)| {
            let (value, size) = cut(value, n, depth + 1);
            (key, value, json_len(&Value::String(key.clone())) + 1 + size)
        })
        .collect();
    let total = container_len(entries.iter().map(|(_, _, size)| *size));
    let mut kept = entries.len();
    if total > n && entries.len() > MIN_OBJECT_KEYS {
        let mut size = 0;
        kept = 0;
        for (_, _, entry) in &entries {
            if kept >= MIN_OBJECT_KEYS && size + entry + 1 > n {
                break;
            }
            size += entry + 1;
            kept += 1;
        }
    }
    let left_out = entries.len() - kept;
    let mut out = Map::new();
    let mut sizes = Vec::with_capacity(kept + 1);
    for (key, value, size) in entries.into_iter().take(kept) {
        out.insert(key.clone(), value);
        sizes.push(size);
    }
    if left_out > 0 {
        let (value, size) = marker(format!("{left_out} of {} keys cut", map.len()));
        // `…` sorts after ASCII keys; a key the object already has is never overwritten.
        if !out.contains_key("…") {
            sizes.push(json_len(&Value::String("…".into())) + 1 + size);
            out.insert("…".into(), value);
        }
    }
    (Value::Object(out), container_len(sizes.into_iter()))
}

/// Length of `[a,b,c]` or `{...}` given the lengths of its members.
fn container_len(sizes: impl Iterator<Item = usize>) -> usize {
    let (count, sum) = sizes.fold((0usize, 0usize), |(c, s), size| (c + 1, s + size));
    2 + sum + count.saturating_sub(1)
}

/// Bytes of `value`'s compact JSON text.
pub fn json_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fits(fitted: &Fitted, budget_tokens: usize) {
        let size = json_len(&fitted.value);
        assert!(
            size <= budget_tokens * 4,
            "{size} bytes over a budget of {budget_tokens} tokens: {}",
            fitted.value
        );
    }

    #[test]
    fn a_value_within_budget_is_unchanged() {
        let value = json!({"a": [1, 2, 3], "b": "text"});
        let fitted = fit_to_budget(&value, 100);
        assert_eq!(fitted.value, value);
        assert!(!fitted.cut);
        assert_eq!(fitted.whole_bytes, value.to_string().len());
    }

    #[test]
    fn a_long_array_keeps_its_first_and_last_items_and_says_how_many_were_cut() {
        let value = Value::Array((0..10_000).map(|i| json!({"id": i})).collect());
        let fitted = fit_to_budget(&value, 200);
        fits(&fitted, 200);
        let items = fitted.value.as_array().expect("still an array");
        assert_eq!(items[0], json!({"id": 0}));
        assert_eq!(items[items.len() - 1], json!({"id": 9999}));
        let marker = items
            .iter()
            .find_map(Value::as_str)
            .expect("a marker element");
        let kept = items.len() - 1;
        assert_eq!(
            marker,
            format!("…[{} of 10000 items cut]…", 10_000 - kept),
            "{marker}"
        );
        assert!(kept > 20, "the budget is used, not wasted: {kept} kept");
    }

    #[test]
    fn a_long_string_is_cut_in_the_middle() {
        let text = format!(
            "{}{}{}",
            "a".repeat(10_000),
            "b".repeat(10_000),
            "c".repeat(10_000)
        );
        let fitted = fit_to_budget(&Value::String(text), 100);
        fits(&fitted, 100);
        let shown = fitted.value.as_str().expect("still a string");
        assert!(
            shown.starts_with("aaaa") && shown.ends_with("cccc"),
            "{shown}"
        );
        assert!(!shown.contains('b'), "the middle is what goes: {shown}");
        let cut: usize = shown
            .split("…[")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("the marker counts the cut characters");
        let (head, rest) = shown.split_once("…[").expect("marker start");
        let (_, tail) = rest.split_once("]…").expect("marker end");
        assert_eq!(cut + head.len() + tail.len(), 30_000);
    }

    #[test]
    fn multibyte_strings_are_cut_on_character_boundaries() {
        let text = "é€😀".repeat(5_000);
        let fitted = fit_to_budget(&json!({ "t": text }), 80);
        fits(&fitted, 80);
        assert!(
            fitted.value["t"]
                .as_str()
                .expect("string")
                .contains("chars cut")
        );
    }

    #[test]
    fn deep_objects_are_cut_at_a_depth() {
        let mut value = json!({"leaf": "x".repeat(50)});
        for level in 0..200 {
            value = json!({ format!("level{level}"): value, "n": level });
        }
        let fitted = fit_to_budget(&value, 100);
        fits(&fitted, 100);
        let text = fitted.value.to_string();
        assert!(text.contains("cut at depth"), "{text}");
        assert!(
            text.starts_with("{\"level199\":{\"level198\":"),
            "the outline stays: {text}"
        );
    }

    #[test]
    fn the_largest_part_is_cut_first_and_small_parts_stay_whole() {
        let value = json!({
            "id": 7,
            "title": "a short title that stays whole",
            "body": "x".repeat(100_000),
            "tags": ["a", "b", "c"],
        });
        let fitted = fit_to_budget(&value, 500);
        fits(&fitted, 500);
        assert_eq!(fitted.value["id"], 7);
        assert_eq!(fitted.value["title"], value["title"]);
        assert_eq!(fitted.value["tags"], value["tags"]);
        let body = fitted.value["body"].as_str().expect("string");
        assert!(
            body.contains("chars cut") && body.len() > 1_000,
            "{}",
            body.len()
        );
    }

    #[test]
    fn objects_with_many_keys_keep_their_first_keys_and_count_the_rest() {
        let value = Value::Object(
            (0..5_000)
                .map(|i| (format!("key{i:05}"), json!(i)))
                .collect(),
        );
        let fitted = fit_to_budget(&value, 100);
        fits(&fitted, 100);
        let map = fitted.value.as_object().expect("still an object");
        assert_eq!(map["key00000"], 0);
        let note = map["…"].as_str().expect("a marker key");
        assert_eq!(
            note,
            format!("{} of 5000 keys cut", 5_000 - (map.len() - 1))
        );
    }

    #[test]
    fn a_report_keeps_its_small_fields_while_its_value_is_cut() {
        let report = json!({
            "ok": true,
            "value": (0..50_000).collect::<Vec<u32>>(),
            "logs": [],
            "stats": {"fuel": 123, "wall_us": 4, "peak_memory_bytes": 5, "calls": 1},
        });
        let fitted = fit_to_budget(&report, 6_000);
        fits(&fitted, 6_000);
        assert_eq!(fitted.value["ok"], true);
        assert_eq!(fitted.value["stats"], report["stats"]);
        assert_eq!(fitted.value["value"][0], 0);
        assert!(fitted.value["value"].is_array());
        assert!(fitted.whole_bytes > 200_000);
    }

    #[test]
    fn cutting_is_a_pure_function_of_the_value_and_the_budget() {
        let value = json!({"rows": (0..3_000).map(|i| json!({"i": i, "s": "y".repeat(i % 97)})).collect::<Vec<_>>()});
        let a = fit_to_budget(&value, 300);
        let b = fit_to_budget(&value, 300);
        assert_eq!(a, b);
        fits(&a, 300);
    }

    #[test]
    fn budgets_below_the_minimum_are_raised_to_it() {
        let value = Value::Array((0..1_000).map(|i| json!(i)).collect());
        let fitted = fit_to_budget(&value, 1);
        fits(&fitted, MIN_RESULT_TOKENS);
        assert!(fitted.cut);
    }
}
