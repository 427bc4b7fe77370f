//! Redaction of backend results before they reach JS, the model or events.

use std::borrow::Cow;
use std::fmt;

use regex::Regex;
use serde_json::{Map, Value};

/// What a redacted secret or pattern match is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Why a [`Redactor`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildRedactorError {
    /// An empty secret would match everywhere.
    #[error("secret {index} is empty; an empty secret would match everywhere")]
    EmptySecret {
        /// Position of the secret in the list.
        index: usize,
    },
    /// A pattern is not a valid regular expression (the pattern itself is not repeated here,
    /// as it may quote a secret).
    #[error("redaction pattern {index} is not a valid regular expression: {source}")]
    InvalidPattern {
        /// Position of the pattern in the list.
        index: usize,
        /// The regex crate's error.
        #[source]
        source: regex::Error,
    },
    /// A pattern matches the empty string, so it would redact nothing useful and insert the
    /// marker between every character.
    #[error("redaction pattern {index} matches the empty string")]
    EmptyMatchPattern {
        /// Position of the pattern in the list.
        index: usize,
    },
    /// All secrets and patterns together exceed the regex crate's size limit.
    #[error("the secrets and patterns together are too large to compile: {source}")]
    TooLarge {
        /// The regex crate's error.
        #[source]
        source: regex::Error,
    },
}

/// Replaces configured secret values (exact strings) and regex patterns with `[REDACTED]`.
///
/// All secrets and patterns are compiled into one regex, secrets first and longest first, so
/// a secret that contains another is replaced whole and text is scanned once.
#[derive(Clone, Default)]
pub struct Redactor {
    matcher: Option<Regex>,
    secret_count: usize,
    pattern_count: usize,
}

// Written by hand because a derived `Debug` would print the secrets into whatever log shows it.
impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secret_count)
            .field("patterns", &self.pattern_count)
            .finish()
    }
}

impl Redactor {
    /// A redactor for these exact secret values and regex patterns (`regex` crate syntax).
    pub fn new(
        secrets: Vec<String>,
        patterns: Vec<String>,
    ) -> Result<Redactor, BuildRedactorError> {
        if let Some(index) = secrets.iter().position(String::is_empty) {
            return Err(BuildRedactorError::EmptySecret { index });
        }
        for (index, pattern) in patterns.iter().enumerate() {
            let compiled = Regex::new(pattern)
                .map_err(|source| BuildRedactorError::InvalidPattern { index, source })?;
            if compiled.is_match("") {
                return Err(BuildRedactorError::EmptyMatchPattern { index });
            }
        }
        let mut sorted_secrets: Vec<&String> = secrets.iter().collect();
        sorted_secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        sorted_secrets.dedup();
        let alternatives: Vec<String> = sorted_secrets
            .iter()
            .map(|secret| regex::escape(secret))
            .chain(patterns.iter().map(|pattern| format!("(?:{pattern})")))
            .collect();
        let matcher = if alternatives.is_empty() {
            None
        } else {
            let combined = Regex::new(&alternatives.join("|"))
                .map_err(|source| BuildRedactorError::TooLarge { source })?;
            Some(combined)
        };
        Ok(Redactor {
            matcher,
            secret_count: secrets.len(),
            pattern_count: patterns.len(),
        })
    }

    /// Whether this redactor has neither secrets nor patterns.
    pub fn is_empty(&self) -> bool {
        self.matcher.is_none()
    }

    /// `text` with every secret and pattern match replaced by `[REDACTED]`; borrowed when
    /// nothing matched.
    pub fn redact_text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.matcher {
            // A pattern such as `\b` can still match empty at some positions; those are kept.
            Some(matcher) => {
                matcher.replace_all(
                    text,
                    |captures: &regex::Captures<'_>| {
                        if captures[0].is_empty() { "" } else { REDACTED }
                    },
                )
            }
            None => Cow::Borrowed(text),
        }
    }

    /// Redacts every string in `value`, nested at any depth, object keys included. When two
    /// keys of one object redact to the same text, the later ones get a ` #2`, ` #3`... suffix
    /// so that no value is silently dropped.
    pub fn redact_json(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(text) => {
                if let Cow::Owned(redacted) = self.redact_text(text) {
                    *text = redacted;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(item)),
            Value::Object(object) => {
                let needs_new_keys = object.keys().any(|key| self.matches(key));
                if needs_new_keys {
                    let old = std::mem::take(object);
                    let mut rebuilt = Map::with_capacity(old.len());
                    for (key, item) in old {
                        let key = unique_key(&rebuilt, self.redact_text(&key).into_owned());
                        rebuilt.insert(key, item);
                    }
                    *object = rebuilt;
                }
                object.values_mut().for_each(|item| self.redact_json(item));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    fn matches(&self, text: &str) -> bool {
        matches!(self.redact_text(text), Cow::Owned(_))
    }
}

fn unique_key(object: &Map<String, Value>, key: String) -> String {
    if !object.contains_key(&key) {
        return key;
    }
    (2..)
        .map(|n| format!("{key} #{n}"))
        .find(|candidate| !object.contains_key(candidate))
        .unwrap_or(key)
}
