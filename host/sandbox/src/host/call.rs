//! What crosses the host's public boundary: tool and verifier requests,
//! their results with the hostcall record, and what inspecting a component
//! reports.

use std::time::Duration;

use poimen_workflow::{Ineligibility, ToolInfo, ToolRef};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::InvokeError;
use crate::imports::Import;
use crate::record::HostcallRecord;
use crate::registry::PluginKind;

/// What a repeatable call runs under ([`PluginHost::repeatable`](crate::PluginHost::repeatable)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeatable {
    /// The digest of the component that would run, `b3:`-prefixed.
    pub digest: String,
    /// Its limits before any caller's tighter timeout.
    pub limits: crate::limits::CallLimits,
}

/// A tool invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tool: ToolRef,
    /// The arguments; canonicalized (RFC 8785) before the guest sees them.
    pub args: Value,
    /// The same on every retry of one logical call (the executor derives it
    /// from run, step and iteration).
    pub idempotency_key: String,
    /// The component digest (`b3:…`) the caller pinned; another registered
    /// component is refused with `DigestMismatch`.
    pub expected_digest: Option<String>,
    /// A tighter wall-clock limit than the tool's own (never a looser one).
    pub timeout: Option<Duration>,
}

impl ToolRequest {
    pub fn new(tool: ToolRef, args: Value, idempotency_key: impl Into<String>) -> Self {
        ToolRequest {
            tool,
            args,
            idempotency_key: idempotency_key.into(),
            expected_digest: None,
            timeout: None,
        }
    }

    /// Pins the component digest.
    pub fn pinned(mut self, digest: impl Into<String>) -> Self {
        self.expected_digest = Some(digest.into());
        self
    }

    /// Tightens the wall-clock limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// A verifier invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierRequest {
    pub verifier: ToolRef,
    /// The attempt's input.
    pub input: Value,
    /// The attempt's output.
    pub output: Value,
    /// The verifier's configuration.
    pub config: Value,
    pub expected_digest: Option<String>,
    pub timeout: Option<Duration>,
}

impl VerifierRequest {
    pub fn new(verifier: ToolRef, input: Value, output: Value, config: Value) -> Self {
        VerifierRequest {
            verifier,
            input,
            output,
            config,
            expected_digest: None,
            timeout: None,
        }
    }
}

/// A verifier's judgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestVerdict {
    pub pass: bool,
    /// In 0..=1.
    pub score: f64,
    pub reason: String,
}

/// The result of a tool invocation and its record.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub outcome: Result<Value, InvokeError>,
    pub record: HostcallRecord,
}

/// The result of a verifier invocation and its record.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierInvocation {
    pub outcome: Result<GuestVerdict, InvokeError>,
    pub record: HostcallRecord,
}

/// What a component says about itself and what it imports, without
/// loading it (`poimen plugin inspect`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inspection {
    pub kind: PluginKind,
    pub info: ToolInfo,
    /// Every import and how a host links it (`linked`: served, through a
    /// declared capability, or linked and denied).
    pub imports: Vec<Import>,
    pub eligibility: Result<(), Vec<Ineligibility>>,
}
