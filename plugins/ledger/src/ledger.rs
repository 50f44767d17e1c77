//! The ledger file format and the append, shared by the `ledger` and
//! `ledger-idempotent` components.
//!
//! A ledger is a JSON-lines file under the granted `/ledger` mount; each
//! line is `{"key": <idempotency key>, "entry": <any JSON>}`. Knows nothing
//! of effect classes: the caller decides whether a key already present
//! stops the append.

use std::fs::OpenOptions;
use std::io::{Read, Write};

use poimen_guest::ToolError;
use serde::Deserialize;
use serde_json::{Value, json};

/// Where the grant is mounted in the guest.
pub const MOUNT: &str = "/ledger";

/// The arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// File name under the mount; defaults to `ledger.jsonl`.
    #[serde(default)]
    pub file: Option<String>,
    /// What to record.
    pub entry: Value,
}

pub const INPUT_SCHEMA: &str = r#"{"type":"object","properties":{"file":{"type":"string","pattern":"^[A-Za-z0-9._-]+$"},"entry":{}},"required":["entry"]}"#;
pub const OUTPUT_SCHEMA: &str = r#"{"type":"object","properties":{"appended":{"type":"boolean"},"lines":{"type":"integer"}},"required":["appended","lines"]}"#;

fn failed(path: &str, e: std::io::Error) -> ToolError {
    ToolError::Failed(format!("{path}: {e}"))
}

/// Appends `{"key", "entry"}` to the ledger, unless `once` and a line with
/// this key is already there. Returns `{"appended": bool, "lines": n}`.
pub fn append(input: Input, key: &str, once: bool) -> Result<Value, ToolError> {
    let name = input.file.unwrap_or_else(|| "ledger.jsonl".to_owned());
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(ToolError::InvalidInput(format!(
            "`{name}` is not a plain file name"
        )));
    }
    let path = format!("{MOUNT}/{name}");
    let mut existing = String::new();
    match std::fs::File::open(&path) {
        Ok(mut f) => {
            f.read_to_string(&mut existing)
                .map_err(|e| failed(&path, e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(&path, e)),
    }
    let lines = existing.lines().filter(|l| !l.is_empty()).count();
    if once {
        let seen = existing
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|v| v.get("key").and_then(Value::as_str) == Some(key));
        if seen {
            return Ok(json!({ "appended": false, "lines": lines }));
        }
    }
    let mut line = json!({ "key": key, "entry": input.entry }).to_string();
    line.push('\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(|e| failed(&path, e))?;
    // One write of the whole line: appends do not interleave mid-line.
    f.write_all(line.as_bytes()).map_err(|e| failed(&path, e))?;
    Ok(json!({ "appended": true, "lines": lines + 1 }))
}
