//! A component's declared output schema, compiled once at load and checked
//! against every result it returns.
//!
//! A schema that accepts everything (`true`, `{}`) is not compiled and costs
//! nothing per call. Otherwise a result is first checked with the fast
//! `is_valid`; only a result that fails has its violations listed, at most
//! [`MAX_VIOLATIONS`], each message at most [`MAX_VIOLATION_MESSAGE_BYTES`].
//! External `$ref`s are never fetched: a schema must be self-contained.
//! This module knows nothing of components or invocations.

use std::fmt::{self, Write as _};

use poimen_workflow::SchemaViolation;
use serde_json::Value;

/// How many violations of one result are listed.
pub const MAX_VIOLATIONS: usize = 16;

/// Length kept of one violation's message (it may quote the offending
/// value, which can be as large as the output limit).
pub const MAX_VIOLATION_MESSAGE_BYTES: usize = 512;

/// A compiled output schema.
pub(crate) enum OutputSchema {
    /// `true` or `{}`: every result passes, nothing is checked.
    Any,
    /// Anything else (`false` included: no result passes).
    Checked(Box<jsonschema::Validator>),
}

impl OutputSchema {
    /// Compiles `schema` (checking it against its meta-schema); the error is
    /// the compiler's, in words.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        match schema {
            Value::Bool(true) => return Ok(OutputSchema::Any),
            Value::Object(m) if m.is_empty() => return Ok(OutputSchema::Any),
            _ => {}
        }
        jsonschema::validator_for(schema)
            .map(|v| OutputSchema::Checked(Box::new(v)))
            .map_err(|e| e.to_string())
    }

    /// Checks a result: `Ok` when it satisfies the schema, else its first
    /// [`MAX_VIOLATIONS`] violations in the order the schema evaluates them.
    pub fn check(&self, output: &Value) -> Result<(), Vec<SchemaViolation>> {
        let OutputSchema::Checked(validator) = self else {
            return Ok(());
        };
        if validator.is_valid(output) {
            return Ok(());
        }
        let violations: Vec<SchemaViolation> = validator
            .iter_errors(output)
            .take(MAX_VIOLATIONS)
            .map(|e| SchemaViolation {
                at: e.instance_path().as_str().to_owned(),
                rule: e.kind().keyword().to_owned(),
                message: bounded(&e, MAX_VIOLATION_MESSAGE_BYTES),
            })
            .collect();
        if violations.is_empty() {
            // `is_valid` and `iter_errors` disagree: report it rather than
            // pass an output the schema refused.
            return Err(vec![SchemaViolation {
                at: String::new(),
                rule: "schema".to_owned(),
                message: "the output does not satisfy the schema".to_owned(),
            }]);
        }
        Err(violations)
    }
}

/// A `fmt::Write` that keeps at most `max` bytes and then refuses more, so
/// formatting a message that quotes a huge value stops early.
struct Bounded {
    text: String,
    max: usize,
    cut: bool,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.max - self.text.len();
        if s.len() <= room {
            self.text.push_str(s);
            return Ok(());
        }
        self.text.push_str(&s[..s.floor_char_boundary(room)]);
        self.cut = true;
        Err(fmt::Error)
    }
}

/// `value`'s `Display`, cut to at most `max` bytes (plus `…` when cut).
fn bounded(value: &impl fmt::Display, max: usize) -> String {
    let mut out = Bounded {
        text: String::new(),
        max,
        cut: false,
    };
    // An error here is the cut (or a failing `Display`): keep what was written.
    let _ = write!(out, "{value}");
    if out.cut {
        out.text.push('…');
    }
    out.text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn compile(schema: Value) -> OutputSchema {
        OutputSchema::compile(&schema).unwrap_or_else(|e| panic!("{schema}: {e}"))
    }

    #[test]
    fn schemas_that_accept_everything_are_not_compiled() {
        assert!(matches!(compile(json!(true)), OutputSchema::Any));
        assert!(matches!(compile(json!({})), OutputSchema::Any));
        assert!(matches!(compile(json!(false)), OutputSchema::Checked(_)));
        assert_eq!(compile(json!({})).check(&json!("anything")), Ok(()));
        assert!(compile(json!(false)).check(&json!(null)).is_err());
    }

    #[test]
    fn an_invalid_schema_does_not_compile() {
        let e = OutputSchema::compile(&json!({"type": 12})).err();
        assert!(e.is_some_and(|m| !m.is_empty()));
        // External references are never fetched.
        assert!(OutputSchema::compile(&json!({"$ref": "https://example.com/s.json"})).is_err());
    }

    #[test]
    fn violations_name_the_pointer_and_the_rule() {
        let s = compile(
            json!({"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}),
        );
        assert_eq!(s.check(&json!({"n": 7})), Ok(()));
        let v = s.check(&json!({"n": "seven"})).expect_err("a string");
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].at.as_str(), v[0].rule.as_str()), ("/n", "type"));
        assert!(v[0].message.contains("seven"), "{}", v[0].message);
        let v = s.check(&json!({})).expect_err("missing");
        assert_eq!((v[0].at.as_str(), v[0].rule.as_str()), ("", "required"));
    }

    #[test]
    fn violations_are_capped_and_messages_bounded() {
        let s = compile(json!({"type": "array", "items": {"type": "integer"}}));
        let many: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        let v = s.check(&json!(many)).expect_err("strings");
        assert_eq!(v.len(), MAX_VIOLATIONS);
        assert_eq!(v[3].at, "/3");

        let s = compile(json!({"type": "integer"}));
        let huge = "é".repeat(10_000);
        let v = s.check(&json!(huge)).expect_err("a string");
        assert!(v[0].message.len() <= MAX_VIOLATION_MESSAGE_BYTES + '…'.len_utf8());
        assert!(v[0].message.ends_with('…'), "{}", v[0].message);
    }
}
