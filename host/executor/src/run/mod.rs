//! One run, interpreted step by step over the IR: the driving context and
//! its commit path.
//!
//! A run is driven by [`RunCtx::drive`] (the walk, `walk.rs`): top-level
//! steps one at a time in the order the validator computed, fan-out only
//! inside a `Parallel` step, attempts strictly serial (`attempt.rs`), the
//! verifiers of one attempt fanned out and joined. Every change is recorded
//! as an episode event *before* it is applied to the in-memory state
//! ([`RunCtx::commit`], the only write path), and every tool call goes
//! through the write-ahead intent wrapper (`intent.rs`) — there is no other
//! path from here to a tool. Each step kind has its own file under `steps/`.
//!
//! The walk is re-entrant: resuming a run refolds its episode and walks
//! again, and every effect already recorded for the current attempt (tool
//! outcome, model answer, verdicts, conditional choice, fork, child run,
//! judgment) is replayed from the record instead of being performed again.
//!
//! This module knows nothing of the executor's verbs (`engine`): it runs
//! one run, creates and drives child runs, and reports how the run stopped.

mod attempt;
mod intent;
mod rubric;
mod start;
mod steps;
mod timers;
mod walk;

use std::collections::BTreeMap;
use std::sync::Arc;

use poimen_store::{
    BlobHash, Commit, Durability, Fence, IntentPhase, IntentRecord, JudgmentWrite, NewEvent, RunId,
    RunStatus, RunUpdate, Store, StoreError,
};
use poimen_workflow::StepId;
use serde_json::Value;

use crate::crash::crash_point;
use crate::effects::Failure;
use crate::episode::{EpisodeEvent, Recorded};
use crate::kernel::Kernel;
use crate::lease::Tenure;
use crate::runnable::Runnable;
use crate::scope::{RunScope, Stop};
use crate::state::{FoldError, RunState, StepState};

pub use start::Started;
pub(crate) use start::{
    CreateError, Fresh, LoadError, NewRunSpec, create, episode, held_message, load, state,
};
pub use steps::judgment_id;

/// How a step execution or one of its attempts ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StepEnd {
    /// With an output.
    Completed(Value),
    /// Without one, for this reason.
    Failed(Failure),
    /// A parallel branch stopped because its join was already decided.
    Lost,
    /// Stopped because the run was cancelled. (A step execution records
    /// its end, then halts the run: [`Halt::Cancelled`].)
    Cancelled,
}

impl From<Stop> for StepEnd {
    fn from(stop: Stop) -> StepEnd {
        match stop {
            Stop::Lost => StepEnd::Lost,
            Stop::RunCancelled => StepEnd::Cancelled,
        }
    }
}

impl From<Result<Value, Failure>> for StepEnd {
    fn from(r: Result<Value, Failure>) -> StepEnd {
        match r {
            Ok(v) => StepEnd::Completed(v),
            Err(f) => StepEnd::Failed(f),
        }
    }
}

/// Why the walk stopped before the run ended.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The run waits for a judgment.
    Waiting,
    /// The run needs an operator (outcome unknown).
    Blocked,
    /// The run was cancelled.
    Cancelled,
    /// The run's version was unloaded and its drain timeout passed.
    Unloaded,
    /// The run must fail now.
    Fail(RunFailure),
    /// The store refused a write: nothing more can be recorded.
    Store(StoreError),
    /// The episode contradicts itself or the workflow.
    Inconsistent(Inconsistency),
}

/// Why a commit did not land (or did not apply).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitError {
    /// The store refused the write.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The write landed but does not fold onto the live state.
    #[error(transparent)]
    Fold(#[from] FoldError),
}

impl From<CommitError> for Halt {
    fn from(e: CommitError) -> Halt {
        match e {
            CommitError::Store(e) => Halt::Store(e),
            CommitError::Fold(e) => Halt::Inconsistent(Inconsistency::Fold(e)),
        }
    }
}

impl From<Inconsistency> for Halt {
    fn from(e: Inconsistency) -> Halt {
        Halt::Inconsistent(e)
    }
}

/// Why a run fails as a whole (recorded as its `run_failed` reason).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RunFailure {
    #[error("step `{step}` failed: {failure}")]
    StepFailed { step: StepId, failure: Failure },
    #[error(
        "deadline exceeded: the run started {elapsed_ms} ms ago and its limit is {limit_ms} ms"
    )]
    Deadline { elapsed_ms: u64, limit_ms: u64 },
    #[error("budget exceeded: wall time {active_ms} ms is over the budget of {budget_ms} ms")]
    WallTime { active_ms: u64, budget_ms: u64 },
    #[error("budget exceeded: {used} tokens used, the budget is {budget}")]
    Tokens { used: u64, budget: u64 },
    #[error("budget exceeded: {made} tool calls made, the budget is {budget}")]
    ToolCalls { made: u64, budget: u64 },
    #[error(
        "budget exceeded: the run may make {budget} tool calls and step `{step}` would make one more"
    )]
    ToolCallBudget { step: StepId, budget: u64 },
    #[error("limit reached: the run has executed {executed} steps, its limit is {limit}")]
    StepLimit {
        step: StepId,
        executed: u64,
        limit: u32,
    },
    #[error("the loop condition from `{from}` to `{to}` failed: {cause}")]
    LoopCondition {
        from: StepId,
        to: StepId,
        cause: crate::render::RenderError,
    },
    #[error(
        "the run's output is {bytes} bytes, over the policy's `[bounds] output-bytes` of {limit}"
    )]
    OutputTooLarge { bytes: u64, limit: u64 },
    #[error("the run's output template failed: {0}")]
    OutputTemplate(crate::render::RenderError),
    #[error("the run's output does not match the workflow's `outputs` schema: {0}")]
    OutputSchema(crate::schema::Violations),
    #[error("the run's result fails the workflow's rubric: {}", rubric::rejection(.0))]
    Rubric(crate::episode::RubricVerdict),
    #[error("internal error: {0}")]
    Inconsistent(Inconsistency),
}

impl RunFailure {
    /// The step the failure is about, if it is about one.
    pub fn step(&self) -> Option<&StepId> {
        match self {
            RunFailure::StepFailed { step, .. }
            | RunFailure::ToolCallBudget { step, .. }
            | RunFailure::StepLimit { step, .. } => Some(step),
            RunFailure::LoopCondition { from, .. } => Some(from),
            _ => None,
        }
    }
}

/// An episode that contradicts itself or the workflow it runs: a defect
/// (of the store's contents or of poimen), never a user's mistake.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Inconsistency {
    #[error("the run was never started")]
    NeverStarted,
    #[error("step `{0}` is not in the workflow")]
    UnknownStep(StepId),
    #[error("{what} `{name}` of step `{step}` was not pinned at the run's start")]
    NotPinned {
        what: &'static str,
        name: String,
        step: StepId,
    },
    #[error("step `{step}` attempt {attempt} has a final intent but no recorded tool call")]
    FinalIntentWithoutCall { step: StepId, attempt: u32 },
    #[error("the join of `{0}` was not recorded")]
    JoinNotRecorded(StepId),
    #[error("a branch task of `{step}` died: {cause}")]
    BranchDied { step: StepId, cause: String },
    #[error(
        "sub-workflow `{workflow}` of step `{step}` was not resolved when the workflow was loaded"
    )]
    SubWorkflowUnresolved { step: StepId, workflow: String },
    #[error("child run {child} stopped while still running: {reason}")]
    ChildStillRunning { child: RunId, reason: String },
    #[error("child run id `{0}` in the episode is not a run id")]
    BadChildId(String),
    #[error("the episode does not fold: {0}")]
    Fold(#[from] FoldError),
}

/// What a driven run came to.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub run: RunId,
    pub status: RunStatus,
    pub output: Option<Value>,
    pub reason: Option<String>,
    /// The run's state as the driver held it when it stopped (the live
    /// state; `assert_refold_identical` compares it with the episode).
    pub state: RunState,
}

impl RunOutcome {
    /// The outcome a run's state describes.
    pub fn of(run: &RunId, state: RunState) -> RunOutcome {
        RunOutcome {
            run: run.clone(),
            status: state.status.unwrap_or(RunStatus::Running),
            output: state.output.clone(),
            reason: state.reason.clone(),
            state,
        }
    }
}

/// A run-status change a commit makes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusChange {
    pub status: RunStatus,
    pub reason: Option<String>,
    pub output_hash: Option<BlobHash>,
    /// The run's timer from this commit on (a waiting run's next deadline).
    pub wake_at: Option<i64>,
}

impl StatusChange {
    pub fn to(status: RunStatus) -> StatusChange {
        StatusChange {
            status,
            reason: None,
            output_hash: None,
            wake_at: None,
        }
    }

    pub fn because(status: RunStatus, reason: impl Into<String>) -> StatusChange {
        StatusChange {
            status,
            reason: Some(reason.into()),
            output_hash: None,
            wake_at: None,
        }
    }

    /// With the run's timer set to `at`.
    pub fn waking(mut self, at: Option<i64>) -> StatusChange {
        self.wake_at = at;
        self
    }
}

/// Everything one store commit writes for a run. By default the commit is
/// buffered (ordered, not fsynced): what must be durable says so.
#[derive(Debug)]
pub(crate) struct Batch {
    pub events: Vec<EpisodeEvent>,
    pub intents: Vec<IntentRecord>,
    pub judgments: Vec<JudgmentWrite>,
    pub blobs: Vec<Vec<u8>>,
    pub update: Option<StatusChange>,
    pub durability: Durability,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            events: Vec::new(),
            intents: Vec::new(),
            judgments: Vec::new(),
            blobs: Vec::new(),
            update: None,
            durability: Durability::Buffered,
        }
    }
}

impl Batch {
    /// Events, buffered.
    pub fn events(events: Vec<EpisodeEvent>) -> Batch {
        Batch {
            events,
            ..Batch::default()
        }
    }

    /// Events with a run-status change, fsynced.
    pub fn status(events: Vec<EpisodeEvent>, change: StatusChange) -> Batch {
        Batch {
            events,
            update: Some(change),
            durability: Durability::Sync,
            ..Batch::default()
        }
    }

    /// Intents (and the events that go with them), fsynced.
    pub fn intents(events: Vec<EpisodeEvent>, intents: Vec<IntentRecord>) -> Batch {
        Batch {
            events,
            intents,
            durability: Durability::Sync,
            ..Batch::default()
        }
    }

    pub fn durability(mut self, durability: Durability) -> Batch {
        self.durability = durability;
        self
    }
}

/// Builds the store commit of `batch` as events `first..` recorded `at`.
pub(crate) fn store_commit(
    run: &RunId,
    fence: Option<Fence>,
    first: u64,
    at: i64,
    events: Vec<EpisodeEvent>,
    batch: Batch,
) -> (Commit, Vec<Recorded>) {
    let recorded: Vec<Recorded> = events
        .into_iter()
        .enumerate()
        .map(|(i, event)| Recorded {
            seq: first + i as u64,
            at,
            event,
        })
        .collect();
    let commit = Commit {
        run: run.clone(),
        fence,
        blobs: batch.blobs,
        events: recorded.iter().map(Recorded::to_new_event).collect(),
        intents: batch.intents,
        judgments: batch.judgments,
        run_update: batch.update.map(|c| RunUpdate {
            status: c.status,
            reason: c.reason,
            output_hash: c.output_hash,
            updated_at: at,
            wake_at: c.wake_at,
        }),
        durability: batch.durability,
    };
    (commit, recorded)
}

/// One run being driven by this host.
pub(crate) struct RunCtx {
    pub kernel: Arc<Kernel>,
    pub store: Arc<dyn Store>,
    pub run: RunId,
    pub runnable: Arc<Runnable>,
    pub scope: RunScope,
    /// Sub-workflow nesting depth of this run (0 for a top-level run).
    pub depth: u32,
    /// The lease this host drives the run under; every commit carries its
    /// fence (see `lease.rs`).
    pub tenure: Arc<Tenure>,
    /// The live state, shared with snapshots: a snapshot is a reference
    /// count, and a commit copies the state only if a snapshot is still
    /// held when it applies its events (`Arc::make_mut`).
    state: tokio::sync::Mutex<Arc<RunState>>,
    /// Intent phases recorded per (step, iteration, attempt).
    intents: std::sync::Mutex<BTreeMap<(StepId, u32, u32), Vec<IntentPhase>>>,
    /// Records the next commit of each lane carries ahead of its own (see
    /// [`Deferred`] and [`Lane`]).
    deferred: std::sync::Mutex<BTreeMap<Lane, Deferred>>,
    /// Records applied to the live state and not yet written: the run's
    /// effect-free work since its last written commit (see [`Tail`]).
    /// Touched only under the state's lock.
    tail: std::sync::Mutex<Tail>,
    /// The starter's trace context, for the run's span.
    pub trace: Option<crate::kernel::TraceCarrier>,
}

/// Records queued for the next commit of their lane, which carries them
/// ahead of its own. A tool step's start rides with its first intent commit,
/// and its `Committed`/`Failed` intent with the step's end: a durable step of
/// a pure or idempotent tool costs two store commits, both fsynced (start +
/// `Pending` + `Dispatched`; `tool_called` + outcome + the step's end), on
/// the spine and in a fan-out branch alike. An effect-free call (a pure
/// component granted no network and no writable mount) writes nothing ahead
/// of itself: its start, `Pending` and `Dispatched` all ride with its
/// outcome — one commit, one fsync (see `intent.rs`). A non-idempotent tool's
/// `Pending` is a buffered commit of its own (see `intent.rs`); a verified
/// step's outcome is fsynced on its own before its verifiers run, and their
/// verdicts (and a rubric's scores) ride with the step's end, buffered.
/// Every shape: at most two fsyncs per tool step.
///
/// Nothing queued is applied until that commit, so a crash before it leaves
/// no trace of it — as if it never happened. For a start that is true:
/// nothing but it happened. For a tool call's outcome the recorded
/// `Dispatched` intent stands for it, which recovery treats as it treats a
/// crash just after the call (re-dispatch under the same idempotency key, or
/// `outcome_unknown` for a non-idempotent tool) — which is why an outcome is
/// queued only when the step's end follows the call at once (`AfterCall`).
/// Verdicts and rubric scores have no effect outside the run: lost, they
/// are taken again.
///
/// Deferral is sound only if the commit that carries a record is the next
/// write of the flow that queued it, and fails *that* flow if it fails.
/// Hence the queues are per [`Lane`]: a fan-out's branches commit
/// concurrently, each from its own task, and a branch's commit carries its
/// own lane's records only. One branch's records never ride in another's
/// commit — whose failure the first would not see, and whose fsync the
/// first's guarantees would then hang on — and a branch's `Dispatched` is
/// durable in its own commit, which returns before its own call.
#[derive(Debug, Default)]
struct Deferred {
    events: Vec<EpisodeEvent>,
    intents: Vec<IntentRecord>,
    /// Blobs the queued events name (a model answer's text).
    blobs: Vec<Vec<u8>>,
    /// The carrying commit is fsynced whatever it asks for: an intent's
    /// outcome is durable before the run moves on.
    sync: bool,
    /// Crash-injection points reached once the carrying commit returns.
    crash_after: Vec<&'static str>,
}

/// Durability at effects, not at steps: the records of a commit that needs
/// no durability — no status change, no judgment, nothing that asked for an
/// fsync (an intent of a call that may have an effect, a model's request or
/// answer, a child's link) — are applied to the live state at once and kept
/// here, in order, instead of being written. The run's next commit that is
/// written carries them ahead of its own records, in the same transaction:
/// the episode stays one append-only log whose `seq`s run on without a gap.
///
/// What the tail holds is recomputable: the outcomes of effect-free calls
/// (pure components granted no network and no writable mount), the steps'
/// starts and ends around them, verdicts, the walk's own choices (a loop's
/// iteration, a fork, a branch taken). A crash loses the tail and nothing
/// else; recovery refolds the written episode and walks on from there,
/// computing the lost steps again — all that computing them again can do.
/// Nothing outside the run has seen a record of the tail: readers of the
/// store see the episode as written, and the run's status changes only in
/// a written commit. A call that may have an effect is preceded by its
/// `Dispatched` intent, which is fsynced and so carries the tail before it:
/// everything an effect could depend on is durable before the effect.
///
/// A bound keeps a long effect-free run from losing much to a crash: when
/// the tail would hold `TailBound::events` events (`kernel.rs`), or its
/// oldest record is `TailBound::ms` old, the commit is written (buffered)
/// instead.
///
/// If a written commit fails, the tail it carried is in no store while the
/// live state holds it: the context refuses every later commit (the drive
/// stops; the run resumes from its written episode, as after a crash).
#[derive(Debug, Default)]
struct Tail {
    events: Vec<NewEvent>,
    intents: Vec<IntentRecord>,
    blobs: Vec<Vec<u8>>,
    /// When its oldest record was applied (the kernel's clock, ms).
    since: Option<i64>,
    /// A written commit carrying the tail failed: nothing may be written
    /// after it (see above).
    lost: bool,
}

/// A serial flow of a run's commits: the spine (the walk, and whatever it
/// awaits in its own task), or one branch of a fan-out (its branch task,
/// and the steps it contains). Within a lane commits are made one after
/// another, so the next commit of the lane that queued a record is the one
/// that carries it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    Spine,
    /// The branch task of this branch step.
    Branch(StepId),
}

tokio::task_local! {
    /// The lane the current task's commits belong to: set by the walk
    /// ([`RunCtx::drive`]) and by each branch task of a fan-out. A task that
    /// sets none (nothing of a run's walk) is on the spine.
    pub(crate) static LANE: Lane;
}

/// The starts of steps queued in `lanes`.
fn queued_starts(lanes: &BTreeMap<Lane, Deferred>) -> u64 {
    lanes
        .values()
        .flat_map(|d| &d.events)
        .filter(|e| matches!(e, EpisodeEvent::StepStarted { .. }))
        .count() as u64
}

/// The lane of the current task.
fn lane() -> Lane {
    LANE.try_with(Lane::clone).unwrap_or(Lane::Spine)
}

impl std::fmt::Debug for RunCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCtx")
            .field("run", &self.run)
            .field("depth", &self.depth)
            .finish()
    }
}

/// Where and how a run is driven: everything [`RunCtx::new`] needs besides
/// the run's recorded state.
pub(crate) struct Driving {
    pub kernel: Arc<Kernel>,
    pub store: Arc<dyn Store>,
    pub run: RunId,
    pub runnable: Arc<Runnable>,
    pub scope: RunScope,
    pub depth: u32,
    pub tenure: Arc<Tenure>,
}

impl RunCtx {
    /// A driving context over a run's refolded state and recorded intents.
    pub fn new(at: Driving, state: RunState, intents: &[IntentRecord]) -> Arc<RunCtx> {
        let mut phases: BTreeMap<(StepId, u32, u32), Vec<IntentPhase>> = BTreeMap::new();
        for i in intents {
            phases
                .entry((i.step.clone(), i.iteration, i.attempt))
                .or_default()
                .push(i.phase);
        }
        Arc::new(RunCtx {
            trace: state.trace.clone(),
            kernel: at.kernel,
            store: at.store,
            run: at.run,
            runnable: at.runnable,
            scope: at.scope,
            depth: at.depth,
            tenure: at.tenure,
            state: tokio::sync::Mutex::new(Arc::new(state)),
            intents: std::sync::Mutex::new(phases),
            deferred: std::sync::Mutex::new(BTreeMap::new()),
            tail: std::sync::Mutex::new(Tail::default()),
        })
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, BTreeMap<Lane, Deferred>> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tail(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues events for the next commit of this task's lane (see
    /// [`Deferred`]).
    fn defer(&self, events: Vec<EpisodeEvent>) {
        self.deferred()
            .entry(lane())
            .or_default()
            .events
            .extend(events);
    }

    /// Queues a step's start (its `step_started` event first) for the next
    /// commit of this task's lane, unless the run's step limit is reached:
    /// then nothing is queued. The count takes in the
    /// starts still queued in every lane, and is taken under the state's
    /// lock (which every commit holds while it moves queued records into
    /// the state), so concurrent branches neither overrun the limit nor
    /// count a start twice. `Err((executed, limit))` when it is reached.
    async fn defer_start(
        &self,
        events: Vec<EpisodeEvent>,
        limit: Option<u32>,
    ) -> Result<(), (u64, u32)> {
        let Some(max) = limit else {
            self.defer(events);
            return Ok(());
        };
        let state = self.state.lock().await;
        let mut deferred = self.deferred();
        let executed = state.spent.step_executions + queued_starts(&deferred);
        if executed >= u64::from(max) {
            return Err((executed, max));
        }
        deferred.entry(lane()).or_default().events.extend(events);
        Ok(())
    }

    /// Starts of steps queued in any lane and not yet committed.
    fn queued_starts(&self) -> u64 {
        queued_starts(&self.deferred())
    }

    /// Queues intent records for the next commit of this task's lane (an
    /// effect-free call's `Pending` and `Dispatched`, which ride with its
    /// outcome: see `intent.rs`).
    fn defer_intents(&self, intents: Vec<IntentRecord>) {
        self.deferred()
            .entry(lane())
            .or_default()
            .intents
            .extend(intents);
    }

    /// Queues an effect's outcome (a tool call's, a model answer) for the
    /// next commit of this task's lane, which is then fsynced if `sync` (see
    /// [`Deferred`]) — an effect-free call's is not, and may stay in the
    /// tail ([`Tail`]); `crash_after` is reached once it is committed.
    fn defer_outcome(
        &self,
        events: Vec<EpisodeEvent>,
        intents: Vec<IntentRecord>,
        blobs: Vec<Vec<u8>>,
        sync: bool,
        crash_after: &'static str,
    ) {
        let mut lanes = self.deferred();
        let d = lanes.entry(lane()).or_default();
        d.events.extend(events);
        d.intents.extend(intents);
        d.blobs.extend(blobs);
        d.sync |= sync;
        d.crash_after.push(crash_after);
    }

    /// Commits what this task's lane still has queued, if anything: a
    /// branch task that halted before its next commit (a start before the
    /// tool-call budget stopped it, an outcome before a verifier could not
    /// be found). On the spine the commit that records the run's end
    /// carries such records; a branch's lane is not the spine's, so its
    /// task commits them itself before it ends — an outcome is never left
    /// behind a `Dispatched` intent.
    pub(crate) async fn flush_queued(&self) -> Result<(), CommitError> {
        let queued = self
            .deferred()
            .get(&lane())
            .is_some_and(|d| !(d.events.is_empty() && d.intents.is_empty()));
        if queued {
            self.commit(Batch::default()).await?;
        }
        Ok(())
    }

    /// The current state, as of now: shared, not copied (the next commit
    /// copies it only if this snapshot is still alive then — drop it
    /// before committing where that is easy).
    pub async fn snapshot(&self) -> Arc<RunState> {
        Arc::clone(&*self.state.lock().await)
    }

    /// Step `id`'s state as it will be once this lane's queued records are
    /// committed. Only that step is copied: the queued events are applied
    /// to a scratch state holding it alone (what other steps or the run's
    /// counters would become is not read), so the cost does not grow with
    /// the run.
    async fn preview_step(&self, id: &StepId) -> Result<Option<StepState>, Halt> {
        let snap = self.snapshot().await;
        let at = self.kernel.clock.now_ms();
        let deferred = self.deferred();
        let events = deferred.get(&lane()).map_or(&[][..], |d| &d.events[..]);
        if events.is_empty() {
            return Ok(snap.steps.get(id).cloned());
        }
        let mut scratch = RunState {
            last_seq: snap.last_seq,
            ..RunState::default()
        };
        if let Some(st) = snap.steps.get(id) {
            scratch.steps.insert(id.clone(), st.clone());
        }
        drop(snap);
        // The queued events are read where they lie, under the lane map's
        // lock (no await below): a big output is not copied to be previewed.
        let first = scratch.last_seq.map_or(0, |s| s + 1);
        for (i, event) in events.iter().enumerate() {
            scratch
                .apply_at(first + i as u64, at, event)
                .map_err(Inconsistency::from)?;
        }
        Ok(scratch.steps.remove(id))
    }

    /// Records events in one buffered commit, then applies them.
    pub async fn record(&self, events: Vec<EpisodeEvent>) -> Result<(), CommitError> {
        self.commit(Batch::events(events)).await
    }

    /// Records one batch — after what this task's lane has queued — then
    /// applies its events to the live state. A batch that needs no
    /// durability joins the run's unwritten tail (see [`Tail`]); any other
    /// is one store commit, carrying the tail ahead of its own records.
    /// Nothing is applied unless it was recorded (written, or held in the
    /// tail).
    pub async fn commit(&self, batch: Batch) -> Result<(), CommitError> {
        let mut state = self.state.lock().await;
        let at = self.kernel.clock.now_ms();
        let first = state.last_seq.map_or(0, |s| s + 1);
        let mut batch = batch;
        let deferred = self.deferred().remove(&lane()).unwrap_or_default();
        let mut events = deferred.events;
        events.append(&mut batch.events);
        let mut intents = deferred.intents;
        intents.append(&mut batch.intents);
        if !deferred.blobs.is_empty() {
            let mut blobs = deferred.blobs;
            blobs.append(&mut batch.blobs);
            batch.blobs = blobs;
        }
        if deferred.sync {
            batch.durability = Durability::Sync;
        }
        // What the run keeps of its intents is their phases: taken here,
        // so the records themselves (with the calls' records) move into
        // the commit uncopied.
        let phases_of: Vec<((StepId, u32, u32), IntentPhase)> = intents
            .iter()
            .map(|i| ((i.step.clone(), i.iteration, i.attempt), i.phase))
            .collect();
        batch.intents = intents;
        let needs_write = batch.durability == Durability::Sync
            || batch.update.is_some()
            || !batch.judgments.is_empty();
        let fence = Some(self.tenure.fence());
        let (mut commit, recorded) = store_commit(&self.run, fence, first, at, events, batch);
        let mut tail = std::mem::take(&mut *self.tail());
        if tail.lost {
            *self.tail() = tail;
            return Err(CommitError::Store(StoreError::InvalidCommit {
                run: self.run.clone(),
                detail: "an earlier write of this run failed, and the effect-free records it carried are in no store: this drive stops here, and the run resumes from its written episode".into(),
            }));
        }
        let held = !needs_write
            && self.kernel.config.tail.holds(
                tail.events.len() + commit.events.len(),
                tail.since.or(Some(at)),
                at,
            );
        if held {
            tail.since.get_or_insert(at);
            tail.events.append(&mut commit.events);
            tail.intents.append(&mut commit.intents);
            tail.blobs.append(&mut commit.blobs);
            *self.tail() = tail;
        } else {
            if !tail.events.is_empty() || !tail.intents.is_empty() {
                tail.events.append(&mut commit.events);
                commit.events = tail.events;
                tail.intents.append(&mut commit.intents);
                commit.intents = tail.intents;
                tail.blobs.append(&mut commit.blobs);
                commit.blobs = tail.blobs;
            }
            if let Err(e) = self.store.commit(commit).await {
                if tail.since.is_some() {
                    self.tail().lost = true;
                }
                return Err(e.into());
            }
        }
        let live = Arc::make_mut(&mut state);
        for r in &recorded {
            live.apply(r)?;
        }
        drop(state);
        if !phases_of.is_empty() {
            let mut phases = self.intents.lock().unwrap_or_else(|p| p.into_inner());
            for (key, phase) in phases_of {
                phases.entry(key).or_default().push(phase);
            }
        }
        if held {
            crash_point("with_unwritten_tail");
        }
        for point in deferred.crash_after {
            crash_point(point);
        }
        Ok(())
    }

    fn phases(&self, step: &StepId, iteration: u32, attempt: u32) -> Vec<IntentPhase> {
        self.intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(step.clone(), iteration, attempt))
            .cloned()
            .unwrap_or_default()
    }
}

#[allow(dead_code)]
fn _assert_send(ctx: Arc<RunCtx>) {
    fn is_send<T: Send>(_: T) {}
    is_send(ctx.drive());
}
