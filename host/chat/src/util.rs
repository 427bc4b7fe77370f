//! Canonical JSON and hashing.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// JSON with object keys sorted at every level and no whitespace (strings as UTF-8, not
/// ASCII-escaped): equal values always give equal text.
pub fn canonical_json(value: &Value) -> String {
    let mut text = Vec::new();
    // Writing to a Vec cannot fail, and only serde_json's own output and ASCII punctuation go
    // in.
    let _ = write_canonical(&mut text, value);
    String::from_utf8(text).unwrap_or_default()
}

/// SHA-256, hex, of `value`'s canonical JSON, hashed as it is written (no sorted copy of the
/// value, no text: a model request carries the whole conversation).
pub fn sha256_json(value: &Value) -> String {
    let mut hasher = HashWriter(Sha256::new());
    // Writing to the hasher cannot fail.
    let _ = write_canonical(&mut hasher, value);
    hex(&hasher.0.finalize())
}

/// Writes `value`'s canonical JSON: keys sorted, scalars and keys as serde_json writes them.
fn write_canonical(out: &mut impl std::io::Write, value: &Value) -> std::io::Result<()> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.write_all(b"{")?;
            for (index, (key, value)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.write_all(b",")?;
                }
                serde_json::to_writer(&mut *out, key)?;
                out.write_all(b":")?;
                write_canonical(out, value)?;
            }
            out.write_all(b"}")
        }
        Value::Array(items) => {
            out.write_all(b"[")?;
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.write_all(b",")?;
                }
                write_canonical(out, item)?;
            }
            out.write_all(b"]")
        }
        scalar => Ok(serde_json::to_writer(&mut *out, scalar)?),
    }
}

/// An `io::Write` that feeds a SHA-256.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    text
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A stable 64-bit value derived from `text` (seeds for replayable randomness).
pub(crate) fn stable_u64(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the journal holds was hashed the earlier way (a sorted copy, as text): the
    /// streaming hash must give the same digests, or every journaled model call would drift.
    #[test]
    fn the_streamed_hash_is_the_hash_of_the_sorted_text() {
        fn sorted(value: &Value) -> Value {
            match value {
                Value::Object(map) => {
                    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                    Value::Object(
                        entries
                            .into_iter()
                            .map(|(k, v)| (k.clone(), sorted(v)))
                            .collect(),
                    )
                }
                Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
                other => other.clone(),
            }
        }
        let value = json!({
            "z": [1, 2.5, -3, {"b": null, "a": true}],
            "a": "quote \" back\\slash \u{7} tab\t é 😀 \u{2028}",
            "m": {"y": [], "x": {}, "k\"ey": 1e300, "n": u64::MAX, "i": i64::MIN},
        });
        let text = sorted(&value).to_string();
        assert_eq!(canonical_json(&value), text);
        assert_eq!(sha256_json(&value), sha256_hex(text.as_bytes()));
        let digest = Sha256::digest(text.as_bytes());
        let formatted: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha256_hex(text.as_bytes()), formatted);
    }
}
