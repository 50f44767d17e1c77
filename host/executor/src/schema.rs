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

/// Checks `value` against `schema`.
pub fn check(schema: &Value, value: &Value) -> Result<(), Violations> {
    let validator = match jsonschema::validator_for(schema) {
        Ok(v) => v,
        // The validator refuses invalid schemas at load; a stored request
        // could still carry one.
        Err(e) => {
            return Err(Violations(vec![SchemaViolation {
                at: String::new(),
                message: format!("the schema itself is invalid: {e}"),
            }]));
        }
    };
    let problems: Vec<SchemaViolation> = validator
        .iter_errors(value)
        .map(|e| SchemaViolation {
            at: e.instance_path().to_string(),
            message: e.to_string(),
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Violations(problems))
    }
}
