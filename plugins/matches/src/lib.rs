//! The `matches` verifier: passes when a field of the attempt's output
//! matches a regex, contains a substring, or equals a JSON value.
//!
//! Pure. Knows nothing of the step whose output it judges.
//!
//! Configuration: `{"pointer": "/field" (default: the whole output), and
//! exactly one of "regex": "...", "contains": "...", "equals": <any JSON>}`.
//! `regex` and `contains` look at the field's text: a string as is, any
//! other value as its JSON text.

use poimen_guest::{ToolError, Verdict, Verifier};
use serde::Deserialize;
use serde_json::Value;

/// The configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pointer: String,
    #[serde(default)]
    regex: Option<String>,
    #[serde(default)]
    contains: Option<String>,
    #[serde(default)]
    equals: Option<Value>,
}

/// The verifier.
#[derive(Debug)]
pub struct Matches;

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Verifier for Matches {
    const NAME: &'static str = "matches";
    const DESCRIPTION: &'static str =
        "A field of the output matches a regex, contains a text, or equals a value.";
    const CONFIG_SCHEMA: &'static str = r#"{"type":"object","properties":{"pointer":{"type":"string"},"regex":{"type":"string"},"contains":{"type":"string"},"equals":{}},"oneOf":[{"required":["regex"]},{"required":["contains"]},{"required":["equals"]}]}"#;
    type Config = Config;

    fn verify(_input: Value, output: Value, config: Config) -> Result<Verdict, ToolError> {
        if !(config.pointer.is_empty() || config.pointer.starts_with('/')) {
            return Err(ToolError::InvalidInput(format!(
                "`{}` is not a JSON Pointer",
                config.pointer
            )));
        }
        let Some(field) = output.pointer(&config.pointer) else {
            return Ok(Verdict::fail(format!(
                "the output has nothing at `{}`",
                config.pointer
            )));
        };
        let at = if config.pointer.is_empty() {
            "the output"
        } else {
            config.pointer.as_str()
        };
        match (config.regex, config.contains, config.equals) {
            (Some(pattern), None, None) => {
                let re = regex::Regex::new(&pattern)
                    .map_err(|e| ToolError::InvalidInput(format!("bad regex: {e}")))?;
                Ok(if re.is_match(&text_of(field)) {
                    Verdict::pass(format!("{at} matches /{pattern}/"))
                } else {
                    Verdict::fail(format!("{at} does not match /{pattern}/"))
                })
            }
            (None, Some(needle), None) => Ok(if text_of(field).contains(&needle) {
                Verdict::pass(format!("{at} contains {needle:?}"))
            } else {
                Verdict::fail(format!("{at} does not contain {needle:?}"))
            }),
            (None, None, Some(expected)) => Ok(if *field == expected {
                Verdict::pass(format!("{at} equals {expected}"))
            } else {
                Verdict::fail(format!("{at} is {field}, not {expected}"))
            }),
            _ => Err(ToolError::InvalidInput(
                "give exactly one of `regex`, `contains` and `equals`".into(),
            )),
        }
    }
}

poimen_guest::export_verifier!(Matches);

#[cfg(test)]
mod tests {
    use super::*;
    use poimen_guest::verify_json;

    #[test]
    fn each_mode() {
        let out = r#"{"a":{"b":"hello 42"},"n":3}"#;
        let v = |c: &str| verify_json::<Matches>("null", out, c).expect("verdict");
        assert!(v(r#"{"pointer":"/a/b","regex":"\\d+$"}"#).pass);
        assert!(!v(r#"{"pointer":"/a/b","regex":"^\\d"}"#).pass);
        assert!(v(r#"{"pointer":"/a/b","contains":"lo 4"}"#).pass);
        assert!(v(r#"{"pointer":"/n","equals":3}"#).pass);
        assert!(!v(r#"{"pointer":"/n","equals":"3"}"#).pass);
        assert!(!v(r#"{"pointer":"/zz","equals":1}"#).pass);
    }

    #[test]
    fn ambiguous_config_is_invalid_input() {
        let r = verify_json::<Matches>("null", "1", r#"{"regex":"a","contains":"b"}"#);
        assert!(matches!(r, Err(ToolError::InvalidInput(_))));
    }
}
