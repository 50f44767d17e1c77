//! The judgment form: fields generated from a request's result schema, and
//! the answer read back from the posted fields. The server validates the
//! answer exactly as `poimen judgment submit` does (the same
//! [`poimen::Host::submit_judgment`]); this only turns form text into JSON
//! by the schema's declared types, so a wrong answer reaches that check and
//! its message, rather than being refused here in other words.

use serde::Serialize;
use serde_json::{Map, Value};

/// One input of the form.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Field {
    pub name: String,
    /// `string`, `number`, `integer`, `boolean`, `enum` or `json`.
    pub kind: &'static str,
    pub required: bool,
    pub description: String,
    /// Choices of an `enum` or `boolean` field.
    pub options: Vec<Choice>,
    /// What the input shows (the value posted before, on an error).
    pub value: String,
}

#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Choice {
    pub value: String,
    pub label: String,
}

/// The fields of an object schema's properties, in the schema's order;
/// none for any other schema (the form then takes the result as JSON).
pub(crate) fn fields(schema: &Value) -> Vec<Field> {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    props
        .iter()
        .map(|(name, s)| {
            let (kind, options) = kind_of(s);
            Field {
                name: name.clone(),
                kind,
                required: required.contains(&name.as_str()),
                description: s
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                options,
                value: String::new(),
            }
        })
        .collect()
}

fn kind_of(s: &Value) -> (&'static str, Vec<Choice>) {
    if let Some(choices) = s.get("enum").and_then(Value::as_array) {
        let options = choices
            .iter()
            .map(|c| Choice {
                value: c.to_string(),
                label: c.as_str().map_or_else(|| c.to_string(), str::to_owned),
            })
            .collect();
        return ("enum", options);
    }
    match s.get("type").and_then(Value::as_str) {
        Some("string") => ("string", Vec::new()),
        Some("number") => ("number", Vec::new()),
        Some("integer") => ("integer", Vec::new()),
        Some("boolean") => (
            "boolean",
            ["true", "false"]
                .map(|b| Choice {
                    value: b.to_owned(),
                    label: b.to_owned(),
                })
                .into(),
        ),
        _ => ("json", Vec::new()),
    }
}

/// The result the posted `field.NAME` values (or `result_json`) make; an
/// error names the field and what it should hold.
pub(crate) fn result(
    fields: &mut [Field],
    posted: &[(String, String)],
    result_json: &str,
) -> Result<Value, String> {
    for f in fields.iter_mut() {
        if let Some((_, v)) = posted
            .iter()
            .find(|(k, _)| k.strip_prefix("field.") == Some(&f.name))
        {
            f.value = v.clone();
        }
    }
    if !result_json.trim().is_empty() {
        return serde_json::from_str(result_json)
            .map_err(|e| format!("the result is not JSON ({e}); write a JSON value, or clear it and fill in the fields"));
    }
    let mut out = Map::new();
    for f in fields.iter() {
        let text = f.value.trim();
        if text.is_empty() {
            // Left out: the schema says whether it may be.
            continue;
        }
        let value = match f.kind {
            "string" => Value::String(f.value.clone()),
            "integer" | "number" => serde_json::from_str::<serde_json::Number>(text)
                .map(Value::Number)
                .map_err(|_| format!("`{}` must be a number, not `{text}`", f.name))?,
            // Enum and boolean options carry their JSON text.
            "enum" | "boolean" | "json" => serde_json::from_str(text).map_err(|e| {
                format!(
                    "`{}` is not JSON ({e}): write a JSON value such as \"text\", 3 or {{}}",
                    f.name
                )
            })?,
            _ => Value::String(f.value.clone()),
        };
        out.insert(f.name.clone(), value);
    }
    Ok(Value::Object(out))
}
