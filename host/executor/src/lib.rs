//! The interpreter over the workflow IR: runs, their write-ahead intents,
//! their episodes, and refold.
//!
//! A run walks a validated workflow's steps driven by its transitions,
//! serially, fanning out only where a `Parallel` step says so. The executor
//! reaches tools, verifiers, models, the clock and storage only through
//! traits ([`effects`], `store::Store`, [`Armory`]); it does not know
//! wasmtime, SQLite or HTTP servers.
#![forbid(unsafe_code)]

mod crash;
pub mod effects;
mod engine;
pub mod episode;
pub mod hash;
pub mod model;
mod plan;
pub mod render;
mod run;
pub mod scope;
pub mod state;

pub use crash::CRASH_POINTS;
pub use effects::{
    Clock, Failure, FailureClass, ModelProvider, ModelRequest, ModelResponse, SystemClock,
    ToolCall, ToolHost, ToolIdentity, ToolResult, Usage, Verdict, VerifierCall, VerifierResult,
};
pub use engine::{
    Armory, ExecError, Executor, ExecutorConfig, JudgmentSubmission, MAX_SUBWORKFLOW_DEPTH,
    StartOptions, Started,
};
pub use episode::{
    Episode, EpisodeEvent, Receipt, Reconciliation, StepStatus, VOLATILE_FIELDS, canonical_order,
    normalize, structure,
};
pub use plan::Armed;
pub use run::{RunOutcome, judgment_id};
pub use scope::{RunScope, TenantId};
pub use state::{RunState, assert_refold_identical, refold};
