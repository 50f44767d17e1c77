//! The sandbox's errors, one type per operation: invoking, loading, building.
//!
//! A tool's own error, a trap and an exhausted limit are different variants:
//! a tool `Err` is not a trap is not a timeout. This module knows how to
//! name and print errors, not how they arise.

use std::fmt;
use std::time::Duration;

use poimen_workflow::{SchemaViolation, Unresolved};
use serde::{Deserialize, Serialize};

use crate::limits::Resource;
use crate::policy::PolicyError;

/// A tool's or verifier's own error, as the guest returned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ToolError {
    /// The arguments do not fit the input schema or make no sense.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The tool ran and failed.
    #[error("failed: {0}")]
    Failed(String),
    /// Something the tool depends on is not there right now.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Why an invocation produced no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvokeError {
    /// No registered tool or verifier matches the reference.
    #[error("{}", unresolved(.0))]
    NotFound(Unresolved),
    /// The caller pinned a component digest that is not what is registered.
    #[error(
        "`{tool}`: expected component {expected}, but the registered matching component is {found}"
    )]
    DigestMismatch {
        tool: String,
        expected: String,
        found: String,
    },
    /// The guest tried to use a capability it was not granted (a host not
    /// on its allowlist, a path outside its mount, a write to a read-only
    /// mount). The guest's own result is discarded.
    #[error("`{component}` was refused `{capability}`: {attempted} ({why}); consulted {policy}")]
    CapabilityDenied {
        component: String,
        capability: String,
        attempted: String,
        why: String,
        policy: String,
    },
    /// The wall-clock limit passed.
    #[error("timed out after {limit:?}")]
    Timeout { limit: Duration },
    /// Linear memory would have grown past the limit.
    #[error("memory limit of {limit_bytes} bytes exhausted (asked for {requested_bytes})")]
    MemoryExhausted {
        limit_bytes: u64,
        requested_bytes: u64,
    },
    /// The fuel budget was burnt.
    #[error("fuel budget of {limit} exhausted")]
    FuelExhausted { limit: u64 },
    /// The call reached the limit of a bounded resource: files open at
    /// once, bytes written to disk, directory depth, resources held, bytes
    /// passed to the host in one call, values in its result. The guest was
    /// stopped at that point (or its result refused).
    #[error("{}", resource_exhausted(*.resource, *.limit))]
    ResourceExhausted { resource: Resource, limit: u64 },
    /// The result (or error message) is larger than the output limit.
    #[error("output of {bytes} bytes is over the limit of {limit_bytes}")]
    OutputTooLarge { bytes: u64, limit_bytes: u64 },
    /// The WebAssembly call stack overflowed.
    #[error("stack overflow")]
    StackOverflow,
    /// The guest's own code failed in its language's way — a Rust panic, an
    /// uncaught Python exception, an uncaught JavaScript error — and trapped;
    /// `message` is what the language printed (the panic message; the
    /// exception and where it was raised), `stderr` the guest's captured
    /// output.
    #[error("{}", guest_failed(*.language, .message))]
    GuestPanicked {
        language: GuestLanguage,
        message: String,
        stderr: String,
    },
    /// Any other trap (including `exit`), with the guest's captured output;
    /// its last lines are part of the message.
    #[error("guest trapped: {trap}{}", output_tail(.stderr))]
    Trap { trap: String, stderr: String },
    /// The guest returned something that breaks the contract (a result that
    /// is not JSON, a score outside 0..=1).
    #[error("invalid output: {0}")]
    InvalidOutput(String),
    /// The tool returned JSON that breaks its declared output schema; the
    /// output is discarded. `tool` is `name@version`; `violations` lists at
    /// most 16, in the order the schema evaluates them.
    #[error("{}", output_schema(.tool, .violations))]
    OutputSchema {
        tool: String,
        violations: Vec<SchemaViolation>,
    },
    /// The tool's own error.
    #[error("{0}")]
    Tool(ToolError),
    /// The host could not set the call up (a granted directory vanished,
    /// instantiation failed). Not the guest's fault.
    #[error("host failure: {0}")]
    Host(String),
    /// The component is installed but withheld: the policy does not grant a
    /// capability it declares. `reason` names the capability, the policy and
    /// how to grant it.
    #[error("`{tool}` is installed but withheld: {reason}")]
    Withheld { tool: String, reason: String },
}

/// The language whose failure a guest's output shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestLanguage {
    Rust,
    Python,
    JavaScript,
}

fn guest_failed(language: GuestLanguage, message: &str) -> String {
    match language {
        GuestLanguage::Rust => format!("guest panicked: {message}"),
        GuestLanguage::Python => format!("guest raised an uncaught Python exception: {message}"),
        GuestLanguage::JavaScript => {
            format!("guest threw an uncaught JavaScript error: {message}")
        }
    }
}

/// How many of the guest's last output lines a trap's message shows.
const TAIL_LINES: usize = 6;

/// `; the guest's output ends: …` with its last non-empty lines, or nothing.
fn output_tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    format!("; the guest's output ends:\n  {}", tail.join("\n  "))
}

fn resource_exhausted(resource: Resource, limit: u64) -> String {
    let mut s = format!(
        "the call reached its limit of {limit} {}",
        resource.describe()
    );
    match resource.policy_key() {
        Some(key) => s.push_str(&format!(
            "; a component that needs more can be given it in the policy: `[plugins.NAME] limits = {{ {key} = N }}`"
        )),
        None => s.push_str(" (a fixed bound of this host)"),
    }
    s
}

fn unresolved(u: &Unresolved) -> String {
    let mut s = format!("no {} matches `{}@{}`", u.registry, u.name, u.requested);
    if !u.available_versions.is_empty() {
        s.push_str(&format!(
            " (registered versions: {})",
            u.available_versions.join(", ")
        ));
    }
    if !u.nearest.is_empty() {
        s.push_str(&format!("; did you mean {}?", u.nearest.join(", ")));
    }
    s
}

fn output_schema(tool: &str, violations: &[SchemaViolation]) -> String {
    let mut s =
        format!("the component `{tool}` returned output that breaks its declared output schema:");
    for (i, v) in violations.iter().enumerate() {
        s.push_str(if i == 0 { " " } else { "; " });
        if v.at.is_empty() {
            s.push_str("at the top level");
        } else {
            s.push_str("at ");
            s.push_str(&v.at);
        }
        s.push_str(&format!(": {}: {}", v.rule, v.message));
    }
    if violations.len() >= crate::schema::MAX_VIOLATIONS {
        s.push_str(&format!(" (the first {} listed)", violations.len()));
    }
    s.push_str("; fix the component or its declared schema");
    s
}

impl InvokeError {
    /// A stable, snake_case name of the variant, used in records.
    pub fn kind(&self) -> &'static str {
        match self {
            InvokeError::NotFound(_) => "not_found",
            InvokeError::DigestMismatch { .. } => "digest_mismatch",
            InvokeError::CapabilityDenied { .. } => "capability_denied",
            InvokeError::Timeout { .. } => "timeout",
            InvokeError::MemoryExhausted { .. } => "memory_exhausted",
            InvokeError::FuelExhausted { .. } => "fuel_exhausted",
            InvokeError::ResourceExhausted { .. } => "resource_exhausted",
            InvokeError::OutputTooLarge { .. } => "output_too_large",
            InvokeError::StackOverflow => "stack_overflow",
            InvokeError::GuestPanicked { .. } => "guest_panicked",
            InvokeError::Trap { .. } => "trap",
            InvokeError::InvalidOutput(_) => "invalid_output",
            InvokeError::OutputSchema { .. } => "output_schema",
            InvokeError::Tool(ToolError::InvalidInput(_)) => "invalid_input",
            InvokeError::Tool(ToolError::Failed(_)) => "failed",
            InvokeError::Tool(ToolError::Unavailable(_)) => "unavailable",
            InvokeError::Host(_) => "host",
            InvokeError::Withheld { .. } => "withheld",
        }
    }
}

/// Why a component was not loaded. Names the component (by origin until its
/// `describe` has run, then by name) and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("{origin}: cannot read: {message}")]
    Read { origin: String, message: String },
    #[error("{origin}: not a WebAssembly component wasmtime can compile: {message}")]
    Compile { origin: String, message: String },
    #[error(
        "{origin}: exports neither the `tool` nor the `verifier` world of {}: {reason}",
        crate::record::WIT_PACKAGE
    )]
    NotAPlugin { origin: String, reason: String },
    #[error(
        "{origin}: imports `{import}`, which this host does not provide (it serves wasi 0.2.x and {})",
        crate::record::WIT_PACKAGE
    )]
    UnknownImport { origin: String, import: String },
    #[error("{origin}: `describe` failed: {error}")]
    Describe {
        origin: String,
        error: Box<InvokeError>,
    },
    #[error("{origin}: bad descriptor: {field}: {message}")]
    BadDescriptor {
        origin: String,
        field: &'static str,
        message: String,
    },
    #[error(
        "`{component}` ({origin}) declares `{capability}`, which {policy} does not grant; to grant it: {hint}"
    )]
    CapabilityDenied {
        component: String,
        origin: String,
        capability: String,
        policy: String,
        hint: String,
    },
    #[error(
        "{origin}: names itself `{name}`, a name reserved by the bundled component {owner}; a third-party component cannot take a first-party name — rename it (the `NAME` of its tool or verifier)"
    )]
    ReservedName {
        name: String,
        origin: String,
        owner: String,
    },
    #[error(
        "`{name}@{version}` is registered twice with different components: {first} and {second}"
    )]
    Conflict {
        name: String,
        version: String,
        first: String,
        second: String,
    },
    #[error(
        "no component `{name}`{} is loaded (loaded: {}); load it instead of replacing or removing it",
        .version.as_ref().map(|v| format!("@{v}")).unwrap_or_default(),
        if .loaded.is_empty() { "none".to_owned() } else { .loaded.join(", ") }
    )]
    NotLoaded {
        name: String,
        version: Option<String>,
        /// The names that are loaded.
        loaded: Vec<String>,
    },
}

impl LoadError {
    /// Where the refused component came from.
    pub fn origin(&self) -> &str {
        match self {
            LoadError::Read { origin, .. }
            | LoadError::Compile { origin, .. }
            | LoadError::NotAPlugin { origin, .. }
            | LoadError::UnknownImport { origin, .. }
            | LoadError::Describe { origin, .. }
            | LoadError::BadDescriptor { origin, .. }
            | LoadError::CapabilityDenied { origin, .. }
            | LoadError::ReservedName { origin, .. } => origin,
            LoadError::Conflict { second, .. } => second,
            LoadError::NotLoaded { name, .. } => name,
        }
    }
}

/// Why a host could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("cannot create the WebAssembly engine: {0}")]
    Engine(String),
    #[error("compile cache {path}: {message}")]
    Cache { path: String, message: String },
    #[error("plugin directory {path}: {message}")]
    PluginDir { path: String, message: String },
    /// The directory calls' scratch space lives under cannot be used.
    #[error("scratch directory {path}: {message}")]
    Scratch { path: String, message: String },
    /// Components were refused; every one is listed.
    #[error("{}", Refused(.0))]
    Refused(Vec<LoadError>),
}

struct Refused<'a>(&'a [LoadError]);

impl fmt::Display for Refused<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} component(s) refused:", self.0.len())?;
        for e in self.0 {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_what_was_searched_and_the_nearest() {
        let e = InvokeError::NotFound(Unresolved {
            name: "jsn".into(),
            requested: "*".into(),
            registry: "tools (bundled)".into(),
            available_versions: vec![],
            nearest: vec!["json".into()],
            withheld: None,
        });
        assert_eq!(
            e.to_string(),
            "no tools (bundled) matches `jsn@*`; did you mean json?"
        );
        assert_eq!(e.kind(), "not_found");
    }

    #[test]
    fn an_output_schema_violation_names_the_tool_pointers_rules_and_the_fix() {
        let e = InvokeError::OutputSchema {
            tool: "adv-bad-output@0.1.0".into(),
            violations: vec![
                SchemaViolation {
                    at: "/n".into(),
                    rule: "type".into(),
                    message: r#""seven" is not of type "integer""#.into(),
                },
                SchemaViolation {
                    at: String::new(),
                    rule: "required".into(),
                    message: r#""m" is a required property"#.into(),
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "the component `adv-bad-output@0.1.0` returned output that breaks its declared \
             output schema: at /n: type: \"seven\" is not of type \"integer\"; at the top \
             level: required: \"m\" is a required property; fix the component or its \
             declared schema"
        );
        assert_eq!(e.kind(), "output_schema");
    }

    #[test]
    fn tool_errors_serialize_by_kind() {
        let v = serde_json::to_value(ToolError::Unavailable("later".into())).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"kind": "unavailable", "message": "later"})
        );
        assert_eq!(
            InvokeError::Tool(ToolError::Failed("x".into())).kind(),
            "failed"
        );
    }
}
