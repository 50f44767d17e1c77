//! Test-only component `adv-bad-output`: declares that it returns
//! `{"n": <integer>}` and returns whatever its input asks.
//!
//! - `{"n": v}` returns `{"n": v}`: valid when `v` is an integer;
//! - `{"raw": v}` returns `v` itself;
//! - anything else returns `{"n": "seven"}`.
//!
//! The host must refuse an output that breaks the declared schema with
//! OutputSchema (naming the JSON Pointer and the rule), discard it, and
//! serve the next call. Never bundled into poimen.

use poimen_guest::{Call, Tool, ToolError};
use serde_json::{Value, json};

/// The component.
#[derive(Debug)]
pub struct BadOutput;

impl Tool for BadOutput {
    const NAME: &'static str = "adv-bad-output";
    const DESCRIPTION: &'static str = "Test only: returns output breaking its declared schema.";
    const INPUT_SCHEMA: &'static str = r#"{"type":"object","properties":{"n":{},"raw":{}}}"#;
    const OUTPUT_SCHEMA: &'static str =
        r#"{"type":"object","required":["n"],"properties":{"n":{"type":"integer"}}}"#;
    type Input = Value;
    type Output = Value;

    fn invoke(input: Value, _call: &Call) -> Result<Value, ToolError> {
        Ok(match input {
            Value::Object(mut m) => match (m.remove("n"), m.remove("raw")) {
                (Some(n), _) => json!({ "n": n }),
                (None, Some(raw)) => raw,
                (None, None) => json!({"n": "seven"}),
            },
            _ => json!({"n": "seven"}),
        })
    }
}

poimen_guest::export_tool!(BadOutput);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_what_the_input_asks() {
        let call = |args: &str| poimen_guest::invoke_json::<BadOutput>(args, "k");
        assert_eq!(call(r#"{"n":7}"#).as_deref(), Ok(r#"{"n":7}"#));
        assert_eq!(call(r#"{"raw":[1]}"#).as_deref(), Ok("[1]"));
        assert_eq!(call("{}").as_deref(), Ok(r#"{"n":"seven"}"#));
    }
}
