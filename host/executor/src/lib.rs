//! The interpreter over the workflow IR: runs, their write-ahead intents,
//! their episodes, and refold.
//!
//! A run walks a validated workflow's steps driven by its transitions,
//! serially, fanning out only where a `Parallel` step says so. The executor
//! reaches tools, verifiers, models, the clock and storage only through
//! traits ([`effects`], `poimen_store::Store`, [`WorkflowLoader`]); it does
//! not know wasmtime, SQLite or HTTP servers. [`testing`] has scripted
//! implementations of those traits for tests without any of them.
//!
//! The rooms: `engine` (the executor's verbs, admission, judgments, their
//! errors), `run` (one run: the commit path, the walk, attempts, the intent
//! wrapper, one file per step kind), `kernel` (what every run shares),
//! [`episode`] and [`state`] (the event log and its fold), [`runnable`]
//! (a version ready to run).
#![forbid(unsafe_code)]

mod crash;
pub mod effects;
mod engine;
pub mod episode;
pub mod hash;
mod kernel;
mod lease;
pub mod model;
pub mod render;
mod run;
pub mod runnable;
pub mod sched;
pub mod schema;
pub mod scope;
pub mod state;
pub mod testing;

pub use crash::CRASH_POINTS;
/// The crash matrix's injection points, for the crates above the executor
/// that hold one (the HTTP API's `before_answer`); a no-op unless built
/// with the `crash-points` feature.
#[doc(hidden)]
pub use crash::crash_point;
pub use effects::{
    Clock, Contract, Failure, FailureClass, JsonType, ModelProvider, ModelRequest, ModelResponse,
    SystemClock, ToolCall, ToolHost, ToolIdentity, ToolResult, Usage, Verdict, VerifierCall,
    VerifierResult,
};
pub use engine::{
    Executor, JudgmentError, JudgmentSubmission, Operation, OperatorError, RunError, ServeOptions,
    ServeReport, StartError, StartOptions,
};
pub use episode::{
    Episode, EpisodeEvent, PinnedChild, PinnedTool, Pins, Receipt, Reconciliation, StepStatus,
    VOLATILE_FIELDS, canonical_order, normalize, structure,
};
pub use kernel::{
    DEFAULT_LEASE_TTL_MS, ExecutorConfig, MAX_SUBWORKFLOW_DEPTH, TailBound, TraceCarrier,
    TraceParent,
};
pub use run::{Inconsistency, RunOutcome, Started, judgment_id};
pub use runnable::{Runnable, WorkflowLoader};
pub use sched::{Pressure, SchedulerConfig, SchedulerStats};
pub use schema::Violations;
pub use scope::{RunScope, TenantId};
pub use state::{RunState, assert_refold_identical, refold};
