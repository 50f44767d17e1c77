//! The `json` tool: selects and reshapes JSON with JSON Pointers (RFC 6901).
//!
//! Pure: it reads only its arguments. It knows nothing of where the JSON came
//! from or where the result goes.
//!
//! Arguments: `{"value": <any>, "select": "/a/0/b"}` returns the value at the
//! pointer (an error if there is none), or `{"value": <any>, "reshape":
//! {"name": "/pointer", ...}}` returns an object with one field per entry
//! (`null` where the pointer finds nothing).

use std::collections::BTreeMap;

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use serde_json::Value;

/// The arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    value: Value,
    #[serde(default)]
    select: Option<String>,
    #[serde(default)]
    reshape: Option<BTreeMap<String, String>>,
}

/// The tool.
#[derive(Debug)]
pub struct Json;

fn check_pointer(p: &str) -> Result<(), ToolError> {
    if p.is_empty() || p.starts_with('/') {
        Ok(())
    } else {
        Err(ToolError::InvalidInput(format!(
            "`{p}` is not a JSON Pointer: it must be empty or start with `/`"
        )))
    }
}

impl Tool for Json {
    const NAME: &'static str = "json";
    const DESCRIPTION: &'static str =
        "Select a value by JSON Pointer, or reshape JSON into a new object of pointers.";
    const INPUT_SCHEMA: &'static str = r#"{
        "type": "object",
        "properties": {
            "value": {},
            "select": {"type": "string"},
            "reshape": {"type": "object", "additionalProperties": {"type": "string"}}
        },
        "required": ["value"],
        "oneOf": [{"required": ["select"]}, {"required": ["reshape"]}]
    }"#;
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        match (input.select, input.reshape) {
            (Some(pointer), None) => {
                check_pointer(&pointer)?;
                input
                    .value
                    .pointer(&pointer)
                    .cloned()
                    .ok_or_else(|| ToolError::Failed(format!("nothing at `{pointer}`")))
            }
            (None, Some(shape)) => {
                let mut out = serde_json::Map::new();
                for (name, pointer) in shape {
                    check_pointer(&pointer)?;
                    out.insert(
                        name,
                        input
                            .value
                            .pointer(&pointer)
                            .cloned()
                            .unwrap_or(Value::Null),
                    );
                }
                Ok(Value::Object(out))
            }
            _ => Err(ToolError::InvalidInput(
                "give exactly one of `select` and `reshape`".into(),
            )),
        }
    }
}

poimen_guest::export_tool!(Json);

#[cfg(test)]
mod tests {
    use super::*;
    use poimen_guest::invoke_json;

    #[test]
    fn selects_and_reshapes() {
        let v = r#"{"value":{"a":[{"b":1},{"b":2}]},"select":"/a/1/b"}"#;
        assert_eq!(invoke_json::<Json>(v, "k"), Ok("2".into()));
        let v = r#"{"value":{"a":{"b":1}},"reshape":{"x":"/a/b","y":"/nope"}}"#;
        assert_eq!(
            invoke_json::<Json>(v, "k"),
            Ok(r#"{"x":1,"y":null}"#.into())
        );
    }

    #[test]
    fn errors_are_typed() {
        let missing = invoke_json::<Json>(r#"{"value":{},"select":"/x"}"#, "k");
        assert!(matches!(missing, Err(ToolError::Failed(_))));
        let bad = invoke_json::<Json>(r#"{"value":{},"select":"x"}"#, "k");
        assert!(matches!(bad, Err(ToolError::InvalidInput(_))));
        let both = invoke_json::<Json>(r#"{"value":{}}"#, "k");
        assert!(matches!(both, Err(ToolError::InvalidInput(_))));
    }
}
