//! JSON Schema checks of values met at run time: a run's input and output,
//! a judge's answer. Problems come back as data ([`Violations`]): each with
//! the JSON Pointer into the value and the broken rule in words.

use poimen_workflow::SchemaViolation;
use serde_json::Value;

/// Every way a value breaks a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violations(pub Vec<SchemaViolation>);

impl std::fmt::Display for Violations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            if v.at.is_empty() {
                f.write_str(&v.message)?;
            } else {
                write!(f, "at {}: {}", v.at, v.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Violations {}

/// Checks `value` against `schema` (compiled for this one check).
pub fn check(schema: &Value, value: &Value) -> Result<(), Violations> {
    Schema::new(schema).check(value)
}

/// A schema compiled once (per workflow version), checked many times.
#[derive(Clone)]
pub struct Schema {
    compiled: Result<std::sync::Arc<jsonschema::Validator>, String>,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.compiled.is_ok() {
            "Schema"
        } else {
            "Schema(invalid)"
        })
    }
}

impl Schema {
    /// Compiles `schema`. (The validator refuses invalid schemas at load;
    /// one that still fails to compile fails every check, naming why.)
    pub fn new(schema: &Value) -> Schema {
        Schema {
            compiled: jsonschema::validator_for(schema)
                .map(std::sync::Arc::new)
                .map_err(|e| e.to_string()),
        }
    }

    /// Checks `value`.
    pub fn check(&self, value: &Value) -> Result<(), Violations> {
        let validator = match &self.compiled {
            Ok(v) => v,
            Err(e) => {
                return Err(Violations(vec![SchemaViolation {
                    at: String::new(),
                    rule: "$schema".to_owned(),
                    message: format!("the schema itself is invalid: {e}"),
                }]));
            }
        };
        if validator.is_valid(value) {
            return Ok(());
        }
        Err(Violations(
            validator
                .iter_errors(value)
                .take(MAX_VIOLATIONS)
                .map(|e| SchemaViolation {
                    at: e.instance_path().to_string(),
                    rule: e.kind().keyword().to_owned(),
                    message: e.to_string(),
                })
                .collect(),
        ))
    }
}

/// Most violations one check reports.
pub const MAX_VIOLATIONS: usize = 16;
