//! Canonical JSON and hashing.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// JSON with object keys sorted at every level and no whitespace (strings as UTF-8, not
/// ASCII-escaped): equal values always give equal text.
pub fn canonical_json(value: &Value) -> String {
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
    sorted(value).to_string()
}

/// SHA-256, hex, of `value`'s canonical JSON.
pub fn sha256_json(value: &Value) -> String {
    sha256_hex(canonical_json(value).as_bytes())
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A stable 64-bit value derived from `text` (seeds for replayable randomness).
pub(crate) fn stable_u64(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(bytes)
}
