//! How capability paths look in JavaScript and TypeScript source.

/// Whether `name` can be written bare after a dot or as a property name. Only ASCII identifiers
/// count; anything else is quoted, which is always correct.
pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_' || first == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// A property name for a TypeScript object type or a JS object literal.
pub(crate) fn property_name(name: &str) -> String {
    if is_identifier(name) {
        name.to_owned()
    } else {
        quote(name)
    }
}

/// A JS/TS string literal. JSON string syntax is valid JS except for U+2028 and U+2029, which
/// serde_json leaves raw and old JS parsers treat as line ends, so those are escaped too.
pub(crate) fn quote(text: &str) -> String {
    let json = serde_json::Value::String(text.to_owned()).to_string();
    json.replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// The expression that reaches a binding, such as `tools.github["get-issue"]`.
pub(crate) fn access_path<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut path = String::from("tools");
    for part in parts {
        if is_identifier(part) {
            path.push('.');
            path.push_str(part);
        } else {
            path.push('[');
            path.push_str(&quote(part));
            path.push(']');
        }
    }
    path
}

/// Why a JS part cannot be bound, if it cannot.
pub(crate) fn invalid_part_reason(part: &str) -> Option<&'static str> {
    if part.is_empty() {
        Some("is empty")
    } else if part == "__proto__" {
        // A binding there would replace the namespace object's prototype instead of adding a key.
        Some("is `__proto__`, which cannot be a binding")
    } else if part.chars().any(char::is_control) {
        Some("contains control characters")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_bare_and_everything_else_is_quoted() {
        assert_eq!(
            access_path(["github", "issues", "list"]),
            "tools.github.issues.list"
        );
        assert_eq!(
            access_path(["git", "get-status"]),
            "tools.git[\"get-status\"]"
        );
        assert_eq!(access_path(["2fa"]), "tools[\"2fa\"]");
        assert_eq!(property_name("$ok_1"), "$ok_1");
        assert_eq!(property_name("a\"b"), "\"a\\\"b\"");
        assert_eq!(quote("line\u{2028}sep"), "\"line\\u2028sep\"");
    }
}
