//! A judge of JSON values against the TypeScript corral renders: a parser for the subset of
//! TypeScript `render_typescript` emits (aliases, keyword, literal, object, array, tuple, union
//! and intersection types) and the assignability rules of TypeScript for values written as JSON.
//! Running `tsc` once per instance would be far too slow for fuzzing; this judge follows
//! `tsc --strict` on that subset, in two modes:
//!
//! - [`Mode::Structural`]: assignability of a value of that shape (a variable, not a literal),
//!   where an object type without an index signature admits keys it does not declare;
//! - [`Mode::Literal`]: as a fresh object literal in a call, where TypeScript's excess-property
//!   check also refuses keys an object type without an index signature does not declare.

use std::collections::HashMap;

use serde_json::Value;

/// How an object literal's undeclared keys are judged (see the module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Structural,
    Literal,
    /// These two are [`Mode::Structural`] and [`Mode::Literal`], except that a number matches
    /// a numeric literal type within `f64::EPSILON`, as the validator (jsonschema 0.33)
    /// compares numbers with `const` and `enum`: used only to tell that known looseness of the
    /// validator from a finding.
    StructuralLikeTheValidator,
    LiteralLikeTheValidator,
}

impl Mode {
    fn admits_undeclared_keys(self) -> bool {
        matches!(self, Mode::Structural | Mode::StructuralLikeTheValidator)
    }

    fn loose_numbers(self) -> bool {
        matches!(
            self,
            Mode::StructuralLikeTheValidator | Mode::LiteralLikeTheValidator
        )
    }

    /// The same mode with the validator's number comparison.
    pub fn like_the_validator(self) -> Mode {
        if self.admits_undeclared_keys() {
            Mode::StructuralLikeTheValidator
        } else {
            Mode::LiteralLikeTheValidator
        }
    }
}

#[derive(Debug, Clone)]
enum Ts {
    Unknown,
    Never,
    String,
    Number,
    Boolean,
    Null,
    Undefined,
    Literal(Value),
    Name(String),
    Array(Box<Ts>),
    Tuple {
        elements: Vec<(Ts, bool)>,
        rest: Option<Box<Ts>>,
    },
    Object {
        properties: Vec<(String, bool, Ts)>,
        index: Option<Box<Ts>>,
    },
    Union(Vec<Ts>),
    Intersection(Vec<Ts>),
}

/// The type aliases of one rendering, by name.
pub struct Declarations {
    aliases: HashMap<String, Ts>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Punct(&'static str),
    Word(String),
    Str(String),
    Num(f64),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    const PUNCTS: &[&str] = &[
        "...", "{", "}", "[", "]", "(", ")", "|", "&", ";", ":", "?", ",", "<", ">", "=", "-",
    ];
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    'outer: while i < bytes.len() {
        let rest = &text[i..];
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
            continue;
        }
        if rest.starts_with("/*") {
            let end = rest.find("*/").ok_or("an unclosed comment")?;
            i += end + 2;
            continue;
        }
        if c == b'"' {
            // A JSON string (the renderer quotes with serde_json).
            let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            match stream.next() {
                Some(Ok(Value::String(s))) => {
                    tokens.push(Token::Str(s));
                    i += stream.byte_offset();
                    continue;
                }
                other => return Err(format!("a bad string literal at {i}: {other:?}")),
            }
        }
        if c.is_ascii_digit() {
            let len = rest
                .find(|ch: char| {
                    !(ch.is_ascii_digit() || ch == '.' || ch == 'e' || ch == 'E' || ch == '+')
                        && ch != '-'
                })
                .unwrap_or(rest.len());
            // A `-` only continues a number right after an exponent marker.
            let mut end = 0;
            let b = rest.as_bytes();
            while end < len {
                if b[end] == b'-' && !(end > 0 && (b[end - 1] == b'e' || b[end - 1] == b'E')) {
                    break;
                }
                end += 1;
            }
            let number: f64 = rest[..end]
                .parse()
                .map_err(|e| format!("a bad number {:?}: {e}", &rest[..end]))?;
            tokens.push(Token::Num(number));
            i += end;
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            let len = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '$'))
                .unwrap_or(rest.len());
            tokens.push(Token::Word(rest[..len].to_string()));
            i += len;
            continue;
        }
        for punct in PUNCTS {
            if rest.starts_with(punct) {
                tokens.push(Token::Punct(punct));
                i += punct.len();
                continue 'outer;
            }
        }
        return Err(format!("an unexpected character {:?} at {i}", &rest[..1]));
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn is(&self, punct: &str) -> bool {
        matches!(self.peek(), Some(Token::Punct(p)) if *p == punct)
    }

    fn eat(&mut self, punct: &str) -> bool {
        let found = self.is(punct);
        if found {
            self.at += 1;
        }
        found
    }

    fn expect(&mut self, punct: &str) -> Result<(), String> {
        if self.eat(punct) {
            Ok(())
        } else {
            Err(format!("expected {punct:?}, found {:?}", self.peek()))
        }
    }

    fn word(&mut self) -> Result<String, String> {
        match self.tokens.get(self.at).cloned() {
            Some(Token::Word(word)) => {
                self.at += 1;
                Ok(word)
            }
            other => Err(format!("expected a name, found {other:?}")),
        }
    }

    fn union(&mut self) -> Result<Ts, String> {
        self.eat("|");
        let mut members = vec![self.intersection()?];
        while self.eat("|") {
            members.push(self.intersection()?);
        }
        Ok(if members.len() == 1 {
            members.remove(0)
        } else {
            Ts::Union(members)
        })
    }

    fn intersection(&mut self) -> Result<Ts, String> {
        let mut parts = vec![self.postfix()?];
        while self.eat("&") {
            parts.push(self.postfix()?);
        }
        Ok(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Ts::Intersection(parts)
        })
    }

    fn postfix(&mut self) -> Result<Ts, String> {
        let mut ts = self.primary()?;
        while self.is("[") && matches!(self.tokens.get(self.at + 1), Some(Token::Punct("]"))) {
            self.at += 2;
            ts = Ts::Array(Box::new(ts));
        }
        Ok(ts)
    }

    fn primary(&mut self) -> Result<Ts, String> {
        match self.tokens.get(self.at).cloned() {
            Some(Token::Punct("(")) => {
                self.at += 1;
                let inner = self.union()?;
                self.expect(")")?;
                Ok(inner)
            }
            Some(Token::Punct("-")) => {
                self.at += 1;
                match self.tokens.get(self.at).cloned() {
                    Some(Token::Num(n)) => {
                        self.at += 1;
                        Ok(Ts::Literal(serde_json::json!(-n)))
                    }
                    other => Err(format!("expected a number after '-', found {other:?}")),
                }
            }
            Some(Token::Num(n)) => {
                self.at += 1;
                Ok(Ts::Literal(serde_json::json!(n)))
            }
            Some(Token::Str(s)) => {
                self.at += 1;
                Ok(Ts::Literal(Value::String(s)))
            }
            Some(Token::Punct("[")) => {
                self.at += 1;
                self.tuple()
            }
            Some(Token::Punct("{")) => {
                self.at += 1;
                self.object()
            }
            Some(Token::Word(word)) => {
                self.at += 1;
                Ok(match word.as_str() {
                    "unknown" => Ts::Unknown,
                    "never" => Ts::Never,
                    "string" => Ts::String,
                    "number" => Ts::Number,
                    "boolean" => Ts::Boolean,
                    "null" => Ts::Null,
                    "undefined" => Ts::Undefined,
                    "true" => Ts::Literal(Value::Bool(true)),
                    "false" => Ts::Literal(Value::Bool(false)),
                    "Record" => {
                        self.expect("<")?;
                        let key = self.word()?;
                        self.expect(",")?;
                        let value = self.union()?;
                        self.expect(">")?;
                        if key != "string" {
                            return Err(format!("Record<{key}, ..> is not rendered"));
                        }
                        Ts::Object {
                            properties: Vec::new(),
                            index: Some(Box::new(value)),
                        }
                    }
                    _ => Ts::Name(word),
                })
            }
            other => Err(format!("expected a type, found {other:?}")),
        }
    }

    fn tuple(&mut self) -> Result<Ts, String> {
        let mut elements = Vec::new();
        let mut rest = None;
        while !self.eat("]") {
            if self.eat("...") {
                match self.postfix()? {
                    Ts::Array(element) => rest = Some(element),
                    other => return Err(format!("a rest element that is no array: {other:?}")),
                }
            } else {
                let element = self.union()?;
                let optional = self.eat("?");
                elements.push((element, optional));
            }
            if !self.eat(",") {
                self.expect("]")?;
                break;
            }
        }
        Ok(Ts::Tuple { elements, rest })
    }

    fn object(&mut self) -> Result<Ts, String> {
        let mut properties = Vec::new();
        let mut index = None;
        while !self.eat("}") {
            if self.eat("[") {
                self.word()?;
                self.expect(":")?;
                self.word()?;
                self.expect("]")?;
                self.expect(":")?;
                index = Some(Box::new(self.union()?));
            } else {
                let name = match self.tokens.get(self.at).cloned() {
                    Some(Token::Word(word)) => word,
                    Some(Token::Str(s)) => s,
                    other => return Err(format!("expected a property name, found {other:?}")),
                };
                self.at += 1;
                let optional = self.eat("?");
                self.expect(":")?;
                properties.push((name, optional, self.union()?));
            }
            if !self.eat(";") {
                self.expect("}")?;
                break;
            }
        }
        Ok(Ts::Object { properties, index })
    }
}

impl Declarations {
    /// The `type Name = ...;` aliases of a rendering (the `declare const tools` is skipped).
    pub fn parse(rendered: &str) -> Result<Declarations, String> {
        let mut parser = Parser {
            tokens: tokenize(rendered)?,
            at: 0,
        };
        let mut aliases = HashMap::new();
        while let Some(token) = parser.peek().cloned() {
            match token {
                Token::Word(word) if word == "type" => {
                    parser.at += 1;
                    let name = parser.word()?;
                    parser.expect("=")?;
                    let ts = parser.union()?;
                    parser.expect(";")?;
                    aliases.insert(name, ts);
                }
                Token::Word(word) if word == "declare" => break,
                other => return Err(format!("expected a declaration, found {other:?}")),
            }
        }
        Ok(Declarations { aliases })
    }

    /// Whether a value of this JSON shape is assignable to the alias `name`.
    pub fn accepts(&self, name: &str, value: &Value, mode: Mode) -> Result<bool, String> {
        self.judge(&Ts::Name(name.to_string()), value, mode, 0)
    }

    fn judge(&self, ts: &Ts, value: &Value, mode: Mode, depth: u32) -> Result<bool, String> {
        if depth > 200 {
            return Err("the types nest too deep to judge".into());
        }
        let judge = |ts: &Ts, value: &Value| self.judge(ts, value, mode, depth + 1);
        Ok(match ts {
            Ts::Unknown => true,
            Ts::Never | Ts::Undefined => false,
            Ts::String => value.is_string(),
            Ts::Number => value.is_number(),
            Ts::Boolean => value.is_boolean(),
            Ts::Null => value.is_null(),
            Ts::Literal(literal) => match (literal, value) {
                (Value::Number(a), Value::Number(b)) if mode.loose_numbers() => {
                    let (a, b) = (
                        a.as_f64().unwrap_or(f64::NAN),
                        b.as_f64().unwrap_or(f64::NAN),
                    );
                    a == b || (a - b).abs() < f64::EPSILON
                }
                (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
                _ => literal == value,
            },
            Ts::Name(name) => {
                let aliased = self
                    .aliases
                    .get(name)
                    .ok_or_else(|| format!("no type named {name}"))?;
                judge(aliased, value)?
            }
            Ts::Array(element) => match value {
                Value::Array(items) => {
                    let mut all = true;
                    for item in items {
                        all &= judge(element, item)?;
                    }
                    all
                }
                _ => false,
            },
            Ts::Tuple { elements, rest } => match value {
                Value::Array(items) => {
                    let mut all = true;
                    for (i, (element, optional)) in elements.iter().enumerate() {
                        all &= match items.get(i) {
                            Some(item) => judge(element, item)?,
                            None => *optional,
                        };
                    }
                    for item in items.iter().skip(elements.len()) {
                        all &= match rest {
                            Some(rest) => judge(rest, item)?,
                            None => false,
                        };
                    }
                    all
                }
                _ => false,
            },
            Ts::Object { properties, index } => match value {
                Value::Object(map) => {
                    let mut all = true;
                    for (name, optional, property) in properties {
                        all &= match map.get(name) {
                            Some(item) => judge(property, item)?,
                            None => *optional,
                        };
                    }
                    for (key, item) in map {
                        let declared = properties.iter().any(|(name, _, _)| name == key);
                        all &= match index {
                            Some(index) => judge(index, item)?,
                            None => declared || mode.admits_undeclared_keys(),
                        };
                    }
                    all
                }
                _ => false,
            },
            Ts::Union(members) => {
                let mut any = false;
                for member in members {
                    any |= judge(member, value)?;
                }
                any
            }
            Ts::Intersection(parts) => {
                let mut all = true;
                for part in parts {
                    all &= judge(part, value)?;
                }
                all
            }
        })
    }
}
