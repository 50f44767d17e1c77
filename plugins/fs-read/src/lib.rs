//! The `fs-read` tool: reads a file, or lists a directory, under the
//! directory the host grants at `/data`.
//!
//! Declares `fs-read:/data`; the host's policy decides which host directory
//! that is, and the host refuses anything outside it (the tool sees the
//! refusal as an I/O error). Relative paths are taken from `/data`.
//!
//! Arguments: `{"path": "notes.txt"}` or `{"path": "/data/sub"}`.
//! Result: `{"path", "content"}` for a file (UTF-8, lossy), `{"path",
//! "entries"}` for a directory (sorted names).

use poimen_guest::{Call, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};

/// Where the grant is mounted in the guest.
pub const MOUNT: &str = "/data";

/// The arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    path: String,
}

/// The tool.
#[derive(Debug)]
pub struct FsRead;

/// `path` as the guest sees it: relative paths are under [`MOUNT`].
fn guest_path(path: &str) -> String {
    if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{MOUNT}/{path}")
    }
}

fn io_error(path: &str, e: std::io::Error) -> ToolError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::Failed(format!("{path}: not found")),
        _ => ToolError::Failed(format!("{path}: {e}")),
    }
}

impl Tool for FsRead {
    const NAME: &'static str = "fs-read";
    const DESCRIPTION: &'static str =
        "Read a file or list a directory under the granted /data mount.";
    const INPUT_SCHEMA: &'static str =
        r#"{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}"#;
    const OUTPUT_SCHEMA: &'static str = r#"{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},"entries":{"type":"array","items":{"type":"string"}}},"required":["path"]}"#;
    const CAPABILITIES: &'static [&'static str] = &["fs-read:/data"];
    type Input = Input;
    type Output = Value;

    fn invoke(input: Input, _call: &Call) -> Result<Value, ToolError> {
        let path = guest_path(&input.path);
        let meta = std::fs::metadata(&path).map_err(|e| io_error(&path, e))?;
        if meta.is_dir() {
            let mut entries = Vec::new();
            for entry in std::fs::read_dir(&path).map_err(|e| io_error(&path, e))? {
                let entry = entry.map_err(|e| io_error(&path, e))?;
                entries.push(entry.file_name().to_string_lossy().into_owned());
            }
            entries.sort();
            Ok(json!({ "path": path, "entries": entries }))
        } else {
            let bytes = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
            Ok(json!({ "path": path, "content": String::from_utf8_lossy(&bytes) }))
        }
    }
}

poimen_guest::export_tool!(FsRead);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_the_mount() {
        assert_eq!(guest_path("a/b.txt"), "/data/a/b.txt");
        assert_eq!(guest_path("/data/x"), "/data/x");
    }
}
