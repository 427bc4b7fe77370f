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

/// SHA-256, hex, of the canonical JSON of `value` as `serde_json` would make it a [`Value`]:
/// the same digest as `sha256_json(&serde_json::to_value(value)?)`, without building the
/// `Value` (for a model request, a tree of the whole conversation, built and dropped at every
/// model call).
pub fn sha256_canonical<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Result<String, serde_json::Error> {
    let mut text = Vec::new();
    value.serialize(canonical::Writer { out: &mut text })?;
    Ok(sha256_hex(&text))
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

/// A serializer that writes what [`write_canonical`] writes of the [`Value`] that
/// `serde_json::to_value` would make: objects' entries sorted by key (the last of equal keys
/// kept, as a map keeps it), non-finite floats as `null`, `f32` widened to `f64`, enum variants
/// as serde_json's externally tagged forms.
mod canonical {
    use std::borrow::Cow;

    use serde::ser::{self, Serialize};
    use serde_json::Error;

    pub(super) struct Writer<'a> {
        pub(super) out: &'a mut Vec<u8>,
    }

    fn scalar<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
        serde_json::to_writer(out, value)
    }

    /// An array being written.
    pub(super) struct Seq<'a> {
        out: &'a mut Vec<u8>,
        first: bool,
        /// Closes a variant's object around it.
        variant: bool,
    }

    impl<'a> Seq<'a> {
        fn open(out: &'a mut Vec<u8>, variant: Option<&str>) -> Result<Self, Error> {
            if let Some(name) = variant {
                out.push(b'{');
                scalar(out, name)?;
                out.push(b':');
            }
            out.push(b'[');
            Ok(Seq {
                out,
                first: true,
                variant: variant.is_some(),
            })
        }

        fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
            if !self.first {
                self.out.push(b',');
            }
            self.first = false;
            value.serialize(Writer { out: self.out })
        }

        fn close(self) -> Result<(), Error> {
            self.out.push(b']');
            if self.variant {
                self.out.push(b'}');
            }
            Ok(())
        }
    }

    /// An object being written: its values are written in the order they come, and the
    /// object is rewritten with its keys sorted when it ends.
    pub(super) struct Map<'a> {
        out: &'a mut Vec<u8>,
        start: usize,
        entries: Vec<(Cow<'static, str>, usize, usize)>,
        key: Option<Cow<'static, str>>,
        variant: Option<&'static str>,
    }

    impl<'a> Map<'a> {
        fn open(out: &'a mut Vec<u8>, variant: Option<&'static str>) -> Self {
            let start = out.len();
            Map {
                out,
                start,
                entries: Vec::new(),
                key: None,
                variant,
            }
        }

        fn entry<T: Serialize + ?Sized>(
            &mut self,
            key: Cow<'static, str>,
            value: &T,
        ) -> Result<(), Error> {
            let from = self.out.len();
            value.serialize(Writer { out: self.out })?;
            self.entries.push((key, from, self.out.len()));
            Ok(())
        }

        fn close(mut self) -> Result<(), Error> {
            // Stable, so that of equal keys the last written is last, and the one kept.
            self.entries.sort_by(|a, b| a.0.cmp(&b.0));
            let written = self.out.split_off(self.start);
            let out = self.out;
            if let Some(name) = self.variant {
                out.push(b'{');
                scalar(out, name)?;
                out.push(b':');
            }
            out.push(b'{');
            let mut first = true;
            for (index, (key, from, to)) in self.entries.iter().enumerate() {
                if self
                    .entries
                    .get(index + 1)
                    .is_some_and(|next| &next.0 == key)
                {
                    continue;
                }
                if !first {
                    out.push(b',');
                }
                first = false;
                scalar(out, key.as_ref())?;
                out.push(b':');
                out.extend_from_slice(&written[from - self.start..to - self.start]);
            }
            out.push(b'}');
            if self.variant.is_some() {
                out.push(b'}');
            }
            Ok(())
        }
    }

    /// A map's key as `serde_json::to_value` makes it: a string, an integer's or a bool's
    /// text; anything else is refused, as there.
    fn key_text<T: Serialize + ?Sized>(key: &T) -> Result<String, Error> {
        match serde_json::to_value(key)? {
            serde_json::Value::String(text) => Ok(text),
            serde_json::Value::Number(number) => Ok(number.to_string()),
            serde_json::Value::Bool(flag) => Ok(flag.to_string()),
            _ => Err(ser::Error::custom("key must be a string")),
        }
    }

    impl<'a> ser::Serializer for Writer<'a> {
        type Ok = ();
        type Error = Error;
        type SerializeSeq = Seq<'a>;
        type SerializeTuple = Seq<'a>;
        type SerializeTupleStruct = Seq<'a>;
        type SerializeTupleVariant = Seq<'a>;
        type SerializeMap = Map<'a>;
        type SerializeStruct = Map<'a>;
        type SerializeStructVariant = Map<'a>;

        fn serialize_bool(self, v: bool) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_i8(self, v: i8) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_i16(self, v: i16) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_i32(self, v: i32) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_i64(self, v: i64) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_i128(self, v: i128) -> Result<(), Error> {
            // As a `Value`'s number: what fits in 64 bits, else refused.
            match (i64::try_from(v), u64::try_from(v)) {
                (Ok(small), _) => scalar(self.out, &small),
                (_, Ok(large)) => scalar(self.out, &large),
                _ => Err(ser::Error::custom("number out of range")),
            }
        }
        fn serialize_u8(self, v: u8) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_u16(self, v: u16) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_u32(self, v: u32) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_u64(self, v: u64) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_u128(self, v: u128) -> Result<(), Error> {
            match u64::try_from(v) {
                Ok(small) => scalar(self.out, &small),
                Err(_) => Err(ser::Error::custom("number out of range")),
            }
        }
        fn serialize_f32(self, v: f32) -> Result<(), Error> {
            self.serialize_f64(f64::from(v))
        }
        fn serialize_f64(self, v: f64) -> Result<(), Error> {
            // serde_json writes a non-finite float as `null`, as `to_value` makes it.
            scalar(self.out, &v)
        }
        fn serialize_char(self, v: char) -> Result<(), Error> {
            scalar(self.out, &v)
        }
        fn serialize_str(self, v: &str) -> Result<(), Error> {
            scalar(self.out, v)
        }
        fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
            let mut seq = Seq::open(self.out, None)?;
            for byte in v {
                seq.element(byte)?;
            }
            seq.close()
        }
        fn serialize_none(self) -> Result<(), Error> {
            self.serialize_unit()
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
            value.serialize(self)
        }
        fn serialize_unit(self) -> Result<(), Error> {
            self.out.extend_from_slice(b"null");
            Ok(())
        }
        fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
            self.serialize_unit()
        }
        fn serialize_unit_variant(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
        ) -> Result<(), Error> {
            scalar(self.out, variant)
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            value: &T,
        ) -> Result<(), Error> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
            value: &T,
        ) -> Result<(), Error> {
            self.out.push(b'{');
            scalar(self.out, variant)?;
            self.out.push(b':');
            value.serialize(Writer { out: self.out })?;
            self.out.push(b'}');
            Ok(())
        }
        fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
            Seq::open(self.out, None)
        }
        fn serialize_tuple(self, _len: usize) -> Result<Seq<'a>, Error> {
            Seq::open(self.out, None)
        }
        fn serialize_tuple_struct(
            self,
            _name: &'static str,
            _len: usize,
        ) -> Result<Seq<'a>, Error> {
            Seq::open(self.out, None)
        }
        fn serialize_tuple_variant(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
            _len: usize,
        ) -> Result<Seq<'a>, Error> {
            Seq::open(self.out, Some(variant))
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Map<'a>, Error> {
            Ok(Map::open(self.out, None))
        }
        fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Map<'a>, Error> {
            if name == "$serde_json::private::RawValue" {
                // `to_value` parses raw JSON; nothing corral hashes holds any.
                return Err(ser::Error::custom("raw JSON is not hashed canonically"));
            }
            Ok(Map::open(self.out, None))
        }
        fn serialize_struct_variant(
            self,
            _name: &'static str,
            _index: u32,
            variant: &'static str,
            _len: usize,
        ) -> Result<Map<'a>, Error> {
            Ok(Map::open(self.out, Some(variant)))
        }
    }

    /// serde's four kinds of array, written alike.
    macro_rules! arrays {
        ($($kind:ident :: $add:ident),+) => {$(
            impl ser::$kind for Seq<'_> {
                type Ok = ();
                type Error = Error;
                fn $add<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                    self.element(value)
                }
                fn end(self) -> Result<(), Error> {
                    self.close()
                }
            }
        )+};
    }
    arrays!(
        SerializeSeq::serialize_element,
        SerializeTuple::serialize_element,
        SerializeTupleStruct::serialize_field,
        SerializeTupleVariant::serialize_field
    );

    impl ser::SerializeMap for Map<'_> {
        type Ok = ();
        type Error = Error;
        fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
            self.key = Some(Cow::Owned(key_text(key)?));
            Ok(())
        }
        fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
            let key = self
                .key
                .take()
                .ok_or_else(|| <Error as ser::Error>::custom("a map value without its key"))?;
            self.entry(key, value)
        }
        fn end(self) -> Result<(), Error> {
            self.close()
        }
    }

    /// A struct and a struct variant, written alike.
    macro_rules! structs {
        ($($kind:ident),+) => {$(
            impl ser::$kind for Map<'_> {
                type Ok = ();
                type Error = Error;
                fn serialize_field<T: Serialize + ?Sized>(
                    &mut self,
                    key: &'static str,
                    value: &T,
                ) -> Result<(), Error> {
                    self.entry(Cow::Borrowed(key), value)
                }
                fn end(self) -> Result<(), Error> {
                    self.close()
                }
            }
        )+};
    }
    structs!(SerializeStruct, SerializeStructVariant);
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
        assert_eq!(sha256_canonical(&value).ok(), Some(sha256_json(&value)));
        assert_eq!(sha256_json(&value), sha256_hex(text.as_bytes()));
        let digest = Sha256::digest(text.as_bytes());
        let formatted: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha256_hex(text.as_bytes()), formatted);
    }

    /// Hashing a value as it is serialized gives the digest of its `Value`: a model request's
    /// journaled digest is the same whichever way it was made, or every turn journaled before
    /// would drift when it resumes.
    #[test]
    fn a_value_hashed_as_it_is_serialized_has_its_values_digest() {
        use std::collections::{BTreeMap, HashMap};

        use corral_models::{Message, ModelRequest, ToolCall, ToolSpec};
        use serde::Serialize;

        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Wrapped(u8);
        #[derive(Serialize)]
        struct Pair(i32, &'static str);
        #[derive(Serialize)]
        enum Outside {
            Plain,
            Newtype(Vec<u8>),
            Tuple(u8, Option<bool>),
            Fields { b: f32, a: f64 },
        }
        #[derive(Serialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Inside {
            One { z: u64, y: String },
        }
        #[derive(Serialize)]
        struct Everything {
            zeta: Option<u8>,
            alpha: Option<&'static str>,
            unit: (),
            unit_struct: Unit,
            wrapped: Wrapped,
            pair: Pair,
            outside: Vec<Outside>,
            inside: Inside,
            numbered: HashMap<u32, &'static str>,
            flags: BTreeMap<bool, u8>,
            wide: i128,
            char: char,
            not_finite: [f64; 3],
            #[serde(flatten)]
            rest: BTreeMap<&'static str, Value>,
        }
        let everything = Everything {
            zeta: None,
            alpha: Some("a\u{0}b"),
            unit: (),
            unit_struct: Unit,
            wrapped: Wrapped(7),
            pair: Pair(-1, "two"),
            outside: vec![
                Outside::Plain,
                Outside::Newtype(vec![0, 255]),
                Outside::Tuple(1, Some(true)),
                Outside::Fields { b: 0.1, a: -2.5e-8 },
            ],
            inside: Inside::One {
                z: u64::MAX,
                y: "é😀".into(),
            },
            numbered: [(10, "ten"), (2, "two"), (33, "thirty-three")].into(),
            flags: [(true, 1), (false, 0)].into(),
            wide: -(1 << 40),
            char: '"',
            not_finite: [f64::NAN, f64::INFINITY, 1.5],
            // Equal to a field's key: the value written last is the one kept.
            rest: [
                ("alpha", json!({"k": [1, {"b": 2, "a": 3}]})),
                ("omega", json!(null)),
            ]
            .into(),
        };
        let request = ModelRequest {
            system: "Be brief.".into(),
            messages: vec![
                Message::User {
                    content: "hi \"there\"".into(),
                },
                Message::Assistant {
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "call_0_0".into(),
                        name: "run_js".into(),
                        arguments: json!({"script": "return 1", "b": [true, 2.25]}),
                    }],
                },
                Message::Tool {
                    tool_call_id: "call_0_0".into(),
                    content: "1".into(),
                    is_error: false,
                },
            ],
            tools: vec![ToolSpec {
                name: "run_js".into(),
                description: "Runs JavaScript.".into(),
                input_schema: json!({"type": "object", "properties": {"script": {"type": "string"}}}),
            }],
            max_output_tokens: 4096,
            call_index: 3,
        };
        fn check<T: Serialize>(value: &T) {
            let as_value = serde_json::to_value(value).expect("a value");
            assert_eq!(
                sha256_canonical(value).expect("hashed"),
                sha256_json(&as_value),
                "{}",
                canonical_json(&as_value)
            );
        }
        check(&everything);
        check(&request);
        check(&json!([]));
        check(&json!({}));
        check(&"text");
        // What a `Value` refuses, this refuses too.
        let large = serde_json::to_value(u128::MAX);
        assert!(large.is_err());
        assert!(sha256_canonical(&u128::MAX).is_err());
    }
}
