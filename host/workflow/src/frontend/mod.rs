//! Front ends: workflow documents in YAML or JSON, parsed into the one IR.
//!
//! Both formats go through the same three stages, so they accept the same
//! documents and report the same errors:
//!
//! 1. **Bytes** — size limit, UTF-8, emptiness ([`parse`]).
//! 2. **Tree** — the format's parser (`serde_norway`, a maintained fork of
//!    `serde_yaml`; `serde_json`) reads a [`node::Node`] tree; duplicate
//!    keys, alias expansion, nesting depth, YAML tags and out-of-range
//!    integers are refused here, at the parser's own position.
//! 3. **Document** — the tree is deserialized into [`doc::WorkflowDoc`]
//!    with typed errors (unknown field with the allowed names and the
//!    nearest one, wrong type, missing field, ...) and a path, which is then
//!    located in the source to give a line and column.
//!
//! Source positions and format quirks end here: the IR has neither. This
//! module does no IO; callers hand it bytes.

mod de;
pub mod doc;
mod locate;
pub(crate) mod node;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ir::WorkflowDef;
use de::DeError;
use node::{Build, Node, NodeSeed};

/// Largest document accepted, in bytes (32 MiB): refused before parsing.
pub const MAX_DOCUMENT_BYTES: usize = 32 * 1024 * 1024;

/// Deepest nesting of mappings and sequences accepted.
pub const MAX_NESTING_DEPTH: usize = 64;

/// Nodes a YAML document may grow by through alias expansion, beyond what
/// its size could hold without aliases: a document of `n` bytes may expand
/// to at most `2n + MAX_ALIAS_EXPANSION` nodes. A "billion laughs" document
/// is refused after that many nodes, in milliseconds.
pub const MAX_ALIAS_EXPANSION: usize = 100_000;

/// The two document formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// The format a file name's extension implies (`.yaml`, `.yml`, `.json`).
    pub fn from_path(path: &str) -> Option<Format> {
        let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        })
    }
}

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PathSeg {
    Key(String),
    Index(usize),
}

/// Renders a path as `steps[3].retry.max_attempts` (`state["odd key"]`).
pub fn path_to_string(path: &[PathSeg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            PathSeg::Index(i) => {
                s.push('[');
                s.push_str(&i.to_string());
                s.push(']');
            }
            PathSeg::Key(k) => {
                let plain = k
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if plain {
                    if !s.is_empty() {
                        s.push('.');
                    }
                    s.push_str(k);
                } else {
                    s.push('[');
                    s.push_str(&serde_json::Value::String(k.clone()).to_string());
                    s.push(']');
                }
            }
        }
    }
    s
}

/// What is wrong with a document.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParseErrorKind {
    #[error("the file is {size} bytes, over the limit of {limit} bytes (MAX_DOCUMENT_BYTES)")]
    TooLarge { size: usize, limit: usize },
    #[error("the file is empty: a workflow needs at least `id` and `steps`")]
    Empty,
    #[error("the file is not UTF-8 (invalid byte at offset {offset}); save it as UTF-8")]
    NotUtf8 { offset: usize },
    #[error("syntax error: {message}")]
    Syntax { message: String },
    #[error("the file holds more than one YAML document; put one workflow per file")]
    MultipleDocuments,
    #[error("duplicate key `{key}`: each key may appear once in a mapping")]
    DuplicateKey { key: String },
    #[error(
        "alias expansion exceeds the bound of {limit} nodes (a \"billion laughs\" document?); write the values out or use fewer aliases"
    )]
    AliasExpansion { limit: usize },
    #[error("nesting deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("unsupported YAML: {what}")]
    UnsupportedYaml { what: String },
    #[error("mapping keys must be strings, found {found}; quote the key")]
    NonStringKey { found: String },
    #[error(
        "number {value} is out of range: integers must lie within ±9007199254740991 (2^53 − 1) and numbers must be finite, so the canonical form represents them exactly"
    )]
    NumberOutOfRange { value: String },
    #[error(
        "unknown field `{field}`{}; allowed here: {}",
        suggest(suggestion),
        list(allowed)
    )]
    UnknownField {
        field: String,
        allowed: Vec<String>,
        suggestion: Option<String>,
    },
    #[error("missing field `{field}`")]
    MissingField { field: String },
    #[error("wrong type: expected {expected}, found {found}")]
    WrongType { expected: String, found: String },
    #[error(
        "unknown value `{variant}`{}; allowed: {}",
        suggest(suggestion),
        list(allowed)
    )]
    UnknownVariant {
        variant: String,
        allowed: Vec<String>,
        suggestion: Option<String>,
    },
    #[error("invalid value: {message}")]
    InvalidValue { message: String },
    #[error("{}", step_kind(step, found))]
    StepKind { step: String, found: Vec<String> },
}

fn suggest(s: &Option<String>) -> String {
    match s {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return "nothing".into();
    }
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn step_kind(step: &str, found: &[String]) -> String {
    let kinds = "`model`, `tool`, `parallel`, `conditional`, `workflow` or `judgment`";
    if found.is_empty() {
        format!("step `{step}` has no kind: give it exactly one of {kinds}")
    } else {
        format!(
            "step `{step}` has {} kinds ({}): give it exactly one of {kinds}",
            found.len(),
            list(found)
        )
    }
}

/// The nearest of `names` to `wanted`, when one is reasonably close.
pub(crate) fn nearest<'a>(
    wanted: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    names
        .into_iter()
        .map(|n| (strsim::jaro_winkler(wanted, n), n))
        .filter(|(score, _)| *score >= 0.75)
        .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, n)| n.to_owned())
}

/// A document that is not a workflow, with everything known about where.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParseError {
    /// The name the caller gave the source (usually its path).
    pub source_name: String,
    pub format: Format,
    /// 1-based line, when the problem has a position.
    pub line: Option<usize>,
    /// 1-based column, when the problem has a position.
    pub column: Option<usize>,
    /// Where in the document (`steps[3].retry`), when known.
    pub path: Option<String>,
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source_name)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        write!(f, ": ")?;
        if let Some(p) = self.path.as_deref().filter(|p| !p.is_empty()) {
            write!(f, "{p}: ")?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for ParseError {}

/// Parses a workflow document into the IR.
///
/// (The error is returned by value, not boxed: it is the cold path, and
/// callers match on `kind` directly.)
///
/// `source_name` is only used in error messages. Nothing is validated
/// beyond the document's shape: run [`crate::validate`] next.
#[allow(clippy::result_large_err)]
pub fn parse(bytes: &[u8], format: Format, source_name: &str) -> Result<WorkflowDef, ParseError> {
    let fail =
        |kind: ParseErrorKind, pos: Option<(usize, usize)>, path: Option<String>| ParseError {
            source_name: source_name.to_owned(),
            format,
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            path,
            kind,
        };
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(fail(
            ParseErrorKind::TooLarge {
                size: bytes.len(),
                limit: MAX_DOCUMENT_BYTES,
            },
            None,
            None,
        ));
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let offset = e.valid_up_to();
            let pos = bytes
                .get(..offset)
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(line_col_at_end);
            return Err(fail(ParseErrorKind::NotUtf8 { offset }, pos, None));
        }
    };
    if is_blank(text, format) {
        return Err(fail(ParseErrorKind::Empty, None, None));
    }
    let node = read_tree(text, format).map_err(|(kind, pos)| fail(kind, pos, None))?;
    let doc = doc::WorkflowDoc::deserialize(node).map_err(|e: DeError| {
        let path = e.path();
        let pos = locate::locate(text, format, &path, e.at_key);
        fail(e.kind, pos, Some(path_to_string(&path)))
    })?;
    doc.into_def().map_err(|(path, e)| {
        let pos = locate::locate(text, format, &path, false);
        fail(e.kind, pos, Some(path_to_string(&path)))
    })
}

/// Line and column just past the end of `prefix`.
fn line_col_at_end(prefix: &str) -> (usize, usize) {
    let line = prefix.bytes().filter(|&b| b == b'\n').count() + 1;
    let last = prefix.rsplit('\n').next().unwrap_or("");
    (line, last.chars().count() + 1)
}

/// Whether the text holds no document: only whitespace (and, in YAML,
/// comments and document markers).
fn is_blank(text: &str, format: Format) -> bool {
    match format {
        Format::Json => text.trim().is_empty(),
        Format::Yaml => text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---" || l == "..."
        }),
    }
}

type TreeError = (ParseErrorKind, Option<(usize, usize)>);

fn read_tree(text: &str, format: Format) -> Result<Node<'_>, TreeError> {
    let build = Build::new(
        text.len()
            .saturating_mul(2)
            .saturating_add(MAX_ALIAS_EXPANSION),
        MAX_NESTING_DEPTH,
    );
    let seed = || NodeSeed {
        build: &build,
        depth: 0,
    };
    use serde::de::DeserializeSeed;
    match format {
        Format::Json => {
            let mut d = serde_json::Deserializer::from_str(text);
            let node = seed().deserialize(&mut d).and_then(|n| d.end().map(|()| n));
            node.map_err(|e| {
                let pos = (e.line() > 0).then(|| (e.line(), e.column().max(1)));
                let kind =
                    build
                        .error
                        .borrow_mut()
                        .take()
                        .unwrap_or_else(|| ParseErrorKind::Syntax {
                            message: strip_position(&e.to_string()),
                        });
                (kind, pos)
            })
        }
        Format::Yaml => {
            let mut docs = serde_norway::Deserializer::from_str(text);
            let Some(first) = docs.next() else {
                return Err((ParseErrorKind::Empty, None));
            };
            let node = seed()
                .deserialize(first)
                .map_err(|e| yaml_error(&build, &e, text))?;
            if let Some(second) = docs.next() {
                // A second document, or a syntax error after the first.
                let probe = serde::de::IgnoredAny::deserialize(second);
                return Err(match probe {
                    Err(e) if !e.to_string().contains("EOF while parsing") => {
                        yaml_error(&build, &e, text)
                    }
                    _ => (ParseErrorKind::MultipleDocuments, None),
                });
            }
            Ok(node)
        }
    }
}

fn yaml_error(build: &Build, e: &serde_norway::Error, text: &str) -> TreeError {
    // The YAML parser places an error at the end of a document without a
    // final line break on the line after its last: that is the document's
    // end. (YAML breaks lines at `\n`, `\r\n` and a lone `\r`.)
    let breaks = text
        .bytes()
        .enumerate()
        .filter(|&(i, b)| b == b'\n' || (b == b'\r' && text.as_bytes().get(i + 1) != Some(&b'\n')))
        .count();
    let pos = e.location().map(|l| match (l.line(), l.column()) {
        (line, _) if line > breaks + 1 => {
            let last = text.rsplit(['\n', '\r']).next().unwrap_or("");
            (breaks + 1, last.chars().count() + 1)
        }
        at => at,
    });
    let kind = build.error.borrow_mut().take().unwrap_or_else(|| {
        let msg = e.to_string();
        if msg.contains("repetition limit exceeded") {
            ParseErrorKind::AliasExpansion {
                limit: MAX_ALIAS_EXPANSION,
            }
        } else if msg.contains("recursion limit exceeded") {
            ParseErrorKind::TooDeep {
                limit: MAX_NESTING_DEPTH,
            }
        } else {
            ParseErrorKind::Syntax {
                message: strip_position(&msg),
            }
        }
    });
    (kind, pos)
}

/// The parsers append " at line L column C" to messages; the error carries
/// the position separately.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// The JSON Schema of the workflow format (draft 2020-12), for editors.
pub fn json_schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(doc::WorkflowDoc);
    schema.insert("$id".into(), "urn:poimen:schema:workflow:1".into());
    schema.to_value()
}
