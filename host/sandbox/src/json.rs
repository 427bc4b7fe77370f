//! JSON text from the guest, parsed leniently where JavaScript and JSON disagree.

use std::borrow::Cow;

use serde_json::Value;

/// How deep JSON crossing the boundary may nest (`wit/sandbox.wit`, "JSON depth"); below
/// serde_json's fixed recursion limit of 128, with room for the envelopes hosts wrap it in.
pub(crate) const MAX_JSON_DEPTH: usize = 100;

/// Whether JSON text nests arrays and objects more than `max` deep (brackets outside strings).
pub(crate) fn deeper_than(text: &str, max: usize) -> bool {
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

/// Parses JSON text produced by the guest's `JSON.stringify`. JavaScript strings may hold lone
/// UTF-16 surrogates, which `JSON.stringify` writes as `\udXXX` escapes that no UTF-8 JSON
/// parser accepts; they become U+FFFD, as when the string is shown anywhere else.
pub(crate) fn parse_guest_json(text: &str) -> Result<Value, serde_json::Error> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(error) => match replace_lone_surrogates(text) {
            Cow::Owned(fixed) => serde_json::from_str(&fixed),
            Cow::Borrowed(_) => Err(error),
        },
    }
}

/// Replaces `\uD800`-`\uDFFF` escapes that are not part of a surrogate pair with `\uFFFD`.
fn replace_lone_surrogates(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let escape_at = |i: usize| -> Option<u16> {
        if bytes.get(i) == Some(&b'\\') && bytes.get(i + 1) == Some(&b'u') {
            let hex = text.get(i + 2..i + 6)?;
            u16::from_str_radix(hex, 16).ok()
        } else {
            None
        }
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escape_at(i) else {
            // Any other escape: skip the backslash and the escaped character.
            i += 2;
            continue;
        };
        let paired = match unit {
            0xD800..=0xDBFF => {
                escape_at(i + 6).is_some_and(|next| (0xDC00..=0xDFFF).contains(&next))
            }
            0xDC00..=0xDFFF => false,
            _ => true,
        };
        if paired && (0xD800..=0xDBFF).contains(&unit) {
            i += 12;
        } else if paired {
            i += 6;
        } else {
            let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
            out.push_str(&text[copied..i]);
            out.push_str("\\uFFFD");
            i += 6;
            copied = i;
        }
    }
    match out {
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_guest_json;
    use serde_json::json;

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        let parsed = parse_guest_json(r#"["a\ud800", "\udc00b", "\ud83d\ude00", "\\ud800"]"#);
        assert_eq!(
            parsed.ok(),
            Some(json!(["a\u{FFFD}", "\u{FFFD}b", "😀", "\\ud800"]))
        );
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert!(!super::deeper_than(r#"[["[[[[", {"a": "]]"}]]"#, 3));
        assert!(super::deeper_than("[[[[]]]]", 3));
        assert!(!super::deeper_than("[[[]]]", 3));
    }

    #[test]
    fn invalid_json_is_still_an_error() {
        assert!(parse_guest_json("{").is_err());
        assert!(parse_guest_json(r#""\ud800"#).is_err());
    }
}
