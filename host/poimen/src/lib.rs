//! poimen: a workflow kernel and WebAssembly plugin host.
//!
//! Workflows are data (YAML or JSON) parsed into one validated IR, named by
//! the Blake3 hash of their canonical form, and interpreted natively. Every
//! tool and verifier is a WebAssembly component run by wasmtime behind a
//! recorded hostcall boundary.
//!
//! This crate is the embedding facade: [`Host`] loads, validates, publishes,
//! plans and runs workflows, and lets operators and judges back into stopped
//! runs. The `poimen` binary (crate `poimen-cli`) and its MCP server are
//! built on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), poimen::Error> {
//! use poimen::{Host, Target};
//! let host = Host::builder().store_path(".poimen/poimen.db").build().await?;
//! let outcome = host
//!     .run(&Target::parse("fixtures/examples/hello.yaml"), serde_json::json!({"text": "hello world"}), Default::default())
//!     .await?;
//! println!("{} {:?}: {:?}", outcome.run, outcome.status, outcome.output);
//! # Ok(()) }
//! ```

mod audit;
mod builder;
pub mod diff;
mod error;
mod events;
mod host;
pub mod loader;
mod metrics;
mod plugins;
pub mod policy;
pub mod shadow;
pub mod tools;
pub mod wiring;

pub use loader::{CheckError, check, fetch_subworkflows};

pub use audit::{Audit, CallRecord, ToolCallAudit, VerdictAudit, VerificationAudit};
pub use builder::PluginSource;
pub use events::{EVENT_BUFFER, EventFilter, HostEvent, RunEvent};
pub use host::RunHandle;
pub use host::{
    Armed, EffortMode, Episode, Error, Host, HostBuilder, Loaded, MAX_WORKFLOW_FILE_BYTES,
    ModelChoice, OpenAiConfig, Parent, Plan, PlannedStep, Published, Retired, Retirement, Rule,
    RunOptions, RunOutcome, RunStatus, Target, load_file,
};

// Every type in the facade's public signatures, by name, so an embedder
// needs no path into the crates below (they stay reachable whole, below,
// for their full vocabulary).
/// What [`Clock::sleep`] returns.
pub use poimen_executor::effects::Sleep;
pub use poimen_executor::episode::{CallOutcome, Recorded, VerdictOutcome, VerdictRecord};
pub use poimen_executor::{
    Clock, EpisodeEvent, Failure, FailureClass, JudgmentError, JudgmentSubmission, ModelProvider,
    ModelRequest, ModelResponse, OperatorError, Receipt, Reconciliation, RunError, RunState,
    ServeOptions, ServeReport, StartError, StepStatus, SystemClock, ToolIdentity, TraceCarrier,
    Usage, Verdict,
};
pub use poimen_sandbox::policy::{Grant, LimitOverrides, Policy, PolicySource};
pub use poimen_sandbox::{
    BuildError, CallLimits, Capability, EffectClass, Entry, HostcallRecord, Inspection, Invocation,
    InvokeError, LoadError, PluginKind, RefusedEntry, Replacement, ToolInfo, ToolRef,
    WithheldEntry,
};
pub use poimen_store::{
    GcReport, IdParseError, IntentPhase, IntentRecord, JudgmentId, JudgmentRecord, JudgmentStatus,
    OpenCheck, RunFilter, RunId, RunRecord, Store, StoreError, VersionRecord, WorkflowSummary,
};
pub use poimen_workflow::{
    EligibilityReport, ParseError, StepId, Validated, ValidationError, WorkflowDef, WorkflowId,
    WorkflowVersion,
};

/// Plugin versions are semantic versions.
pub use semver;

// The crates below the facade, for embedders that need their vocabulary.
pub use poimen_executor as executor;
pub use poimen_sandbox as sandbox;
pub use poimen_store as store;
pub use poimen_workflow as workflow;

use async_trait::async_trait;

/// The model provider of a host configured without one: every model step
/// fails as unavailable, naming the fix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoModel;

#[async_trait]
impl ModelProvider for NoModel {
    fn provider(&self) -> &str {
        "none"
    }

    fn default_model(&self) -> &str {
        "none"
    }

    async fn complete(&self, _request: ModelRequest) -> Result<ModelResponse, Failure> {
        Err(Failure::new(
            FailureClass::Unavailable,
            "no model provider is configured; pass `--model URL` (an OpenAI-compatible endpoint) or `--model-script FILE`",
        ))
    }
}
