//! The `json-schema` verifier: passes when the attempt's output conforms to
//! the JSON Schema in the verifier's configuration.
//!
//! Pure. Uses the `jsonschema` crate without its network features: a schema
//! that `$ref`s a remote document is refused as invalid configuration rather
//! than fetched. Knows nothing of the step whose output it judges.
//!
//! Configuration: `{"schema": {...}}`. The verdict's reason lists up to ten
//! violations with their instance paths.

use poimen_guest::{ToolError, Verdict, Verifier};
use serde::Deserialize;
use serde_json::Value;

/// How many violations the reason lists.
pub const MAX_REPORTED: usize = 10;

/// The configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    schema: Value,
}

/// The verifier.
#[derive(Debug)]
pub struct JsonSchema;

impl Verifier for JsonSchema {
    const NAME: &'static str = "json-schema";
    const DESCRIPTION: &'static str =
        "The output conforms to the JSON Schema in the configuration.";
    const CONFIG_SCHEMA: &'static str = r#"{"type":"object","properties":{"schema":{"type":["object","boolean"]}},"required":["schema"]}"#;
    type Config = Config;

    fn verify(_input: Value, output: Value, config: Config) -> Result<Verdict, ToolError> {
        let validator = jsonschema::validator_for(&config.schema)
            .map_err(|e| ToolError::InvalidInput(format!("not a usable JSON Schema: {e}")))?;
        let errors: Vec<String> = validator
            .iter_errors(&output)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("{}: {e}", if at.is_empty() { "/" } else { at.as_str() })
            })
            .collect();
        if errors.is_empty() {
            return Ok(Verdict::pass("the output conforms to the schema"));
        }
        let mut reason = format!("{} violation(s): ", errors.len());
        reason.push_str(
            &errors
                .iter()
                .take(MAX_REPORTED)
                .cloned()
                .collect::<Vec<_>>()
                .join("; "),
        );
        Ok(Verdict::fail(reason))
    }
}

poimen_guest::export_verifier!(JsonSchema);

#[cfg(test)]
mod tests {
    use super::*;
    use poimen_guest::verify_json;

    const CONFIG: &str =
        r#"{"schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}"#;

    #[test]
    fn passes_and_fails() {
        let ok = verify_json::<JsonSchema>("null", r#"{"n":1}"#, CONFIG).expect("verdict");
        assert!(ok.pass);
        assert_eq!(ok.score, 1.0);
        let bad = verify_json::<JsonSchema>("null", r#"{"n":"x"}"#, CONFIG).expect("verdict");
        assert!(!bad.pass);
        assert!(bad.reason.contains("/n"), "{}", bad.reason);
    }

    #[test]
    fn a_bad_schema_is_invalid_input() {
        let r = verify_json::<JsonSchema>("null", "1", r#"{"schema":{"type":12}}"#);
        assert!(matches!(r, Err(ToolError::InvalidInput(_))));
    }
}
