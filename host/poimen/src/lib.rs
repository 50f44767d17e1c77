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

pub mod diff;
mod host;
pub mod loader;
pub mod shadow;
pub mod tools;
pub mod wiring;

pub use loader::{CheckError, check, fetch_subworkflows};

// The crates below the facade, for embedders that need their vocabulary
// (the CLI uses nothing else).
pub use host::{
    Audit, EffortMode, Episode, Error, Host, HostBuilder, Loaded, MAX_WORKFLOW_FILE_BYTES,
    ModelChoice, OpenAiConfig, Parent, Plan, PlannedStep, Published, Rule, RunOptions, RunOutcome,
    RunStatus, Target, load_file,
};
pub use poimen_executor as executor;
pub use poimen_executor::{
    JudgmentError, JudgmentSubmission, OperatorError, Reconciliation, RunError, RunState,
    StartError,
};
pub use poimen_sandbox as sandbox;
pub use poimen_store as store;
pub use poimen_workflow as workflow;

use async_trait::async_trait;
use poimen_executor::{Failure, FailureClass, ModelProvider, ModelRequest, ModelResponse};

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
