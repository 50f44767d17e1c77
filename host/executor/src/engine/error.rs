//! The executor's errors, one enum per kind of operation: starting a run,
//! reading or driving one, an operator's verb, a judge's answer. Each
//! message says what went wrong and what to do; every field is the value
//! itself (ids, statuses, schema violations), never a description of it.

use poimen_store::{IdempotencyConflict, RunId, RunStatus, StoreError};
use poimen_workflow::{StepId, WorkflowId};

use crate::effects::Failure;
use crate::episode::EpisodeError;
use crate::render::RenderError;
use crate::run::{CreateError, LoadError};
use crate::schema::Violations;
use crate::state::FoldError;

/// Why a run could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("the input does not match the `inputs` schema of workflow `{workflow}`: {violations}")]
    InvalidInput {
        workflow: WorkflowId,
        violations: Violations,
    },
    #[error("cannot start workflow `{workflow}`: {cause}")]
    Unavailable {
        workflow: WorkflowId,
        cause: Failure,
    },
    #[error(
        "workflow `{workflow}`{} already has {} active run(s) ({}), its `concurrency.max_runs` is {max_runs} and `on_overflow` is drop: the run was refused; wait for one to finish, or cancel one with `poimen cancel RUN`",
        key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default(),
        active.len(),
        active.iter().map(RunId::as_str).collect::<Vec<_>>().join(", ")
    )]
    Overflow {
        workflow: WorkflowId,
        key: Option<String>,
        max_runs: u32,
        active: Vec<RunId>,
    },
    #[error(
        "the `key` template of workflow `{workflow}` cannot be rendered from the input: {cause}"
    )]
    Key {
        workflow: WorkflowId,
        cause: RenderError,
    },
    #[error("`concurrency.scope: key` of workflow `{workflow}` needs a `key` template")]
    NoKeyTemplate { workflow: WorkflowId },
    #[error("{0}")]
    IdempotencyConflict(Box<IdempotencyConflict>),
    #[error("the store failed: {0}")]
    Store(StoreError),
    #[error("the run's start does not fold: {0}")]
    Fold(FoldError),
    /// Cancelling the run it replaces (`on_overflow: replace`) failed.
    #[error("cannot replace an active run: {0}")]
    Replace(Box<OperatorError>),
    /// Refused under pressure: retryable (later, or on another host).
    #[error(
        "this host is under pressure (`{level}`: {queued} step(s) waiting for {workers} worker(s)), so new `{}`-priority runs of `{workflow}` are shed; retry later or on another host (`high` runs are never shed)",
        match .priority { poimen_workflow::Priority::Low => "low", poimen_workflow::Priority::Normal => "normal", poimen_workflow::Priority::High => "high" }
    )]
    Shed {
        workflow: WorkflowId,
        priority: poimen_workflow::Priority,
        level: crate::sched::Pressure,
        queued: usize,
        workers: usize,
    },
}

impl StartError {
    /// Whether the same start may succeed if tried again unchanged: a run
    /// shed under pressure, or a store that failed for the moment.
    pub fn is_retryable(&self) -> bool {
        match self {
            StartError::Shed { .. } => true,
            StartError::Store(e) => e.is_unavailable(),
            _ => false,
        }
    }
}

impl From<StoreError> for StartError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::IdempotencyConflict(c) => StartError::IdempotencyConflict(c),
            other => StartError::Store(other),
        }
    }
}

impl From<CreateError> for StartError {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::InvalidInput {
                workflow,
                violations,
            } => StartError::InvalidInput {
                workflow,
                violations,
            },
            CreateError::Unavailable { workflow, cause } => {
                StartError::Unavailable { workflow, cause }
            }
            CreateError::Store(e) => e.into(),
            CreateError::Fold(e) => StartError::Fold(e),
        }
    }
}

/// Why a run could not be read or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    #[error("run {0} does not exist; `poimen status` lists runs")]
    UnknownRun(RunId),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("cannot run workflow `{workflow}`: {cause}")]
    Unavailable {
        workflow: WorkflowId,
        cause: Failure,
    },
    #[error("sub-workflow nesting is deeper than the kernel's bound of {max}")]
    TooDeep { max: u32 },
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Undecodable(#[from] EpisodeError),
    #[error("run {run}'s episode does not fold: {cause}")]
    Fold { run: RunId, cause: FoldError },
    /// Another host drives the run (it holds a live lease on it).
    #[error("{}", crate::run::held_message(.run, .holder))]
    Held {
        run: RunId,
        holder: Option<poimen_store::Lease>,
    },
}

impl From<LoadError> for RunError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Store(e) => RunError::Store(e),
            LoadError::Undecodable(e) => RunError::Undecodable(e),
            LoadError::Fold { run, cause } => RunError::Fold { run, cause },
            LoadError::Held { run, holder } => RunError::Held { run, holder },
        }
    }
}

/// An operator's verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Cancel,
    Retry,
    Reconcile,
}

impl Operation {
    /// Why a run in the wrong status cannot take this verb, and what to do.
    fn refusal(self) -> &'static str {
        match self {
            Operation::Cancel => "it already ended; nothing to cancel",
            Operation::Retry => {
                "only a failed run can be retried (a completed or cancelled run is final); `poimen resume` continues a stopped one"
            }
            Operation::Reconcile => "only a blocked run takes a reconciliation",
        }
    }
}

fn list(steps: &[StepId]) -> String {
    if steps.is_empty() {
        "none".to_owned()
    } else {
        steps
            .iter()
            .map(StepId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why an operator's verb (cancel, retry, reconcile) was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    #[error("run {run} is {status:?}; {}", operation.refusal())]
    WrongStatus {
        run: RunId,
        status: RunStatus,
        operation: Operation,
    },
    #[error(
        "step `{step}` of run {run}: it is not a top-level step of the workflow; top-level steps: {}",
        list(top_level)
    )]
    NotTopLevel {
        run: RunId,
        step: StepId,
        top_level: Vec<StepId>,
    },
    #[error(
        "run {run} is {status:?}; every step completed; name a step with --from to run again from it"
    )]
    NothingToRetry { run: RunId, status: RunStatus },
    #[error(
        "step `{step}` of run {run}: it has no dispatched tool call with an unknown outcome; steps in flight: {}",
        list(in_flight)
    )]
    NoOpenCall {
        run: RunId,
        step: StepId,
        in_flight: Vec<StepId>,
    },
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<StoreError> for OperatorError {
    fn from(e: StoreError) -> Self {
        OperatorError::Run(RunError::Store(e))
    }
}

impl From<LoadError> for OperatorError {
    fn from(e: LoadError) -> Self {
        OperatorError::Run(e.into())
    }
}

/// Why a judge's answer was refused (the run stays waiting).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JudgmentError {
    #[error("judgment {0} does not exist; `poimen judgment list` shows the open ones")]
    Unknown(String),
    #[error("judgment {id} was already answered; the answer stands and the run has moved on")]
    Closed { id: String },
    #[error(
        "judgment {id}: the submitted request hash {got} is not the request's {expected}; fetch the request again with `poimen judgment show {id}`"
    )]
    RequestHashMismatch {
        id: String,
        expected: String,
        got: String,
    },
    #[error("judgment {id}: the result does not match the request's result schema: {violations}")]
    ResultSchema { id: String, violations: Violations },
    #[error("judgment {id}: the request expects {field} `{expected}`, the submission says `{got}`")]
    ExecutorMismatch {
        id: String,
        field: &'static str,
        expected: String,
        got: String,
    },
    #[error(
        "judgment {id}: the submission's provenance must name the judge (`provenance.judge`) — give an object such as {{\"judge\": \"alice@example.com\", \"method\": \"manual review\"}}"
    )]
    Provenance { id: String },
    #[error(transparent)]
    Run(#[from] RunError),
}

impl From<StoreError> for JudgmentError {
    fn from(e: StoreError) -> Self {
        JudgmentError::Run(RunError::Store(e))
    }
}

impl From<LoadError> for JudgmentError {
    fn from(e: LoadError) -> Self {
        JudgmentError::Run(e.into())
    }
}
