//! The `text` tool: regex find, extract, replace and count.
//!
//! Pure: it reads only its arguments. The regex dialect is the `regex`
//! crate's (no look-around, no backreferences: linear time on any input).
//!
//! Arguments: `{"op": "find" | "extract" | "replace" | "count", "pattern":
//! "...", "text": "..."}`, plus `"replacement"` for `replace`.
//! - `find`: `{"matches": [{"start", "end", "text"}]}` (byte offsets)
//! - `extract`: `{"captures": [{"0": ..., "1": ..., "name": ...}]}`, one
//!   object per match, one field per group that took part
//! - `replace`: `{"text": "...", "replaced": n}` (`$1`, `$name` expand)
//! - `count`: `{"count": n}`

use poimen_guest::{Call, Tool, ToolError};
use regex::Regex;
use serde::Deserialize;
use serde_json::{Value, json};

/// The arguments.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Input {
    Find {
        pattern: String,
        text: String,
    },
    Extract {
        pattern: String,
        text: String,
    },
    Replace {
        pattern: String,
        text: String,
        replacement: String,
    },
    Count {
        pattern: String,
        text: String,
    },
}

/// The tool.
#[derive(Debug)]
pub struct Text;

fn compile(pattern: &str) -> Result<Regex, ToolError> {
    Regex::new(pattern).map_err(|e| ToolError::InvalidInput(format!("bad pattern: {e}")))
}

impl Tool for Text {
    const NAME: &'static str = "text";
    const DESCRIPTION: &'static str = "Regex find / extract / replace / count over a text.";
    const INPUT_SCHEMA: &'static str = r#"{
        "type": "object",
        "properties": {
            "op": {"enum": ["find", "extract", "replace", "count"]},
            "pattern": {"type": "string"},
            "text": {"type": "string"},
            "replacement": {"type": "string"}
        },
        "required": ["op", "pattern", "text"]
    }"#;
    const OUTPUT_SCHEMA: &'static str = r#"{"type": "object"}"#;
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        Ok(match input {
            Input::Find { pattern, text } => {
                let matches: Vec<Value> = compile(&pattern)?
                    .find_iter(&text)
                    .map(|m| json!({"start": m.start(), "end": m.end(), "text": m.as_str()}))
                    .collect();
                json!({ "matches": matches })
            }
            Input::Extract { pattern, text } => {
                let re = compile(&pattern)?;
                let names: Vec<Option<&str>> = re.capture_names().collect();
                let captures: Vec<Value> = re
                    .captures_iter(&text)
                    .map(|caps| {
                        let mut obj = serde_json::Map::new();
                        for (i, name) in names.iter().enumerate() {
                            if let Some(m) = caps.get(i) {
                                let key = name.map_or_else(|| i.to_string(), str::to_owned);
                                obj.insert(key, Value::String(m.as_str().to_owned()));
                            }
                        }
                        Value::Object(obj)
                    })
                    .collect();
                json!({ "captures": captures })
            }
            Input::Replace {
                pattern,
                text,
                replacement,
            } => {
                let re = compile(&pattern)?;
                let replaced = re.find_iter(&text).count();
                json!({ "text": re.replace_all(&text, replacement.as_str()), "replaced": replaced })
            }
            Input::Count { pattern, text } => {
                json!({ "count": compile(&pattern)?.find_iter(&text).count() })
            }
        })
    }
}

poimen_guest::export_tool!(Text);

#[cfg(test)]
mod tests {
    use super::*;
    use poimen_guest::invoke_json;

    fn run(args: Value) -> Result<Value, ToolError> {
        invoke_json::<Text>(&args.to_string(), "k").map(|s| serde_json::from_str(&s).expect("json"))
    }

    #[test]
    fn each_op() {
        let t = "a1 b22 c333";
        assert_eq!(
            run(json!({"op":"count","pattern":"\\d+","text":t})),
            Ok(json!({"count":3}))
        );
        assert_eq!(
            run(json!({"op":"find","pattern":"b\\d+","text":t})),
            Ok(json!({"matches":[{"start":3,"end":6,"text":"b22"}]}))
        );
        assert_eq!(
            run(json!({"op":"extract","pattern":"(?<l>[a-z])(\\d+)","text":"x9"})),
            Ok(json!({"captures":[{"0":"x9","l":"x","2":"9"}]}))
        );
        assert_eq!(
            run(json!({"op":"replace","pattern":"\\d","text":"a1b2","replacement":"#"})),
            Ok(json!({"text":"a#b#","replaced":2}))
        );
    }

    #[test]
    fn bad_pattern_is_invalid_input() {
        let r = run(json!({"op":"count","pattern":"(","text":""}));
        assert!(matches!(r, Err(ToolError::InvalidInput(_))));
    }
}
