//! The episode: the append-only event log of one run, and its only source of
//! truth.
//!
//! Every state change of a run is an [`EpisodeEvent`]; the live run state is
//! the fold of its events (see `state`), so a run can always be rebuilt —
//! refolded — from its episode alone. This module owns the event vocabulary
//! and the normalizer used to compare episodes across runs; it does not know
//! how events are stored (crate `store`) or produced (the interpreter).

use std::collections::BTreeMap;
use std::sync::Arc;

use poimen_workflow::{
    Capability, EffectClass, JoinPolicy, Reducer, StepId, WorkflowId, WorkflowVersion,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::effects::{Failure, ToolIdentity, Usage, Verdict};

/// Status of one step execution.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not started (or reset by a loop).
    #[default]
    Pending,
    /// Started and not finished.
    Running,
    /// Waiting for something outside the run (a judgment).
    Waiting,
    /// Finished with an output.
    Completed,
    /// Finished without one, after its retries.
    Failed,
    /// Stopped because the run was cancelled.
    Cancelled,
    /// A parallel branch stopped because its join was already decided.
    Lost,
    /// A conditional target that was not chosen.
    Skipped,
}

impl StepStatus {
    /// The status as recorded (`completed`, `lost`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::Waiting => "waiting",
            StepStatus::Completed => "completed",
            StepStatus::Failed => "failed",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Lost => "lost",
            StepStatus::Skipped => "skipped",
        }
    }

    /// Whether the step execution is over.
    pub fn is_finished(self) -> bool {
        !matches!(
            self,
            StepStatus::Pending | StepStatus::Running | StepStatus::Waiting
        )
    }
}

/// The parent side of a child run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    pub run: poimen_store::RunId,
    pub step: StepId,
    pub iteration: u32,
}

/// A tool the run pinned at its start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedTool {
    pub identity: ToolIdentity,
    pub effect: EffectClass,
    /// A workflow registered as a tool: the version a call runs as a child
    /// run (`identity.digest` names it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<WorkflowVersion>,
}

/// A sub-workflow step's child, pinned at the parent's start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedChild {
    pub version: WorkflowVersion,
    /// What the child pins: its tools, verifiers and own sub-workflows.
    pub pins: Pins,
}

/// Everything a run can reach, resolved once when it starts: tools and
/// verifiers (by reference text) with their digests, and each sub-workflow
/// step's child version with the child's own pins, transitively.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pins {
    pub tools: BTreeMap<String, PinnedTool>,
    pub verifiers: BTreeMap<String, ToolIdentity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subworkflows: BTreeMap<StepId, PinnedChild>,
}

/// One criterion's verdict in a rubric's scoring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionVerdict {
    pub criterion: String,
    pub weight: f64,
    pub verifier: ToolIdentity,
    pub outcome: VerdictOutcome,
    /// The verifier's hostcall record.
    pub record: Value,
}

/// A rubric's verdict on one output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricVerdict {
    pub criteria: Vec<CriterionVerdict>,
    /// `Σ wᵢ·sᵢ / Σ wᵢ` over the criteria (a criterion that could not score
    /// scores 0).
    pub score: f64,
    /// The score the output needs; absent: every criterion must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    pub passed: bool,
}

/// The outcome of one recorded call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CallOutcome {
    /// The output is shared: the event, the run state and the step's
    /// receipt hold one copy of what may be a large value.
    Ok {
        #[serde(with = "shared_value")]
        output: Arc<Value>,
        output_hash: String,
    },
    Err {
        failure: Failure,
    },
}

/// An `Arc<Value>` (de)serialized as the value it shares.
mod shared_value {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(v: &Arc<Value>, s: S) -> Result<S::Ok, S::Error> {
        Value::serialize(v, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Value>, D::Error> {
        Value::deserialize(d).map(Arc::new)
    }
}

impl CallOutcome {
    pub fn into_result(self) -> Result<Value, Failure> {
        match self {
            CallOutcome::Ok { output, .. } => Ok(Arc::unwrap_or_clone(output)),
            CallOutcome::Err { failure } => Err(failure),
        }
    }
}

/// One verifier's verdict on an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub verifier: ToolIdentity,
    pub config: Value,
    pub outcome: VerdictOutcome,
    /// The verifier's hostcall record.
    pub record: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum VerdictOutcome {
    Verdict(Verdict),
    Err { failure: Failure },
}

impl VerdictRecord {
    /// Whether the verdict lets the attempt pass.
    pub fn passed(&self) -> bool {
        matches!(&self.outcome, VerdictOutcome::Verdict(v) if v.pass)
    }
}

/// An operator's decision on a tool call whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Reconciliation {
    /// The effect happened; this is its output.
    Committed { output: Value },
    /// The effect did not happen (or is to be treated as failed).
    Failed { reason: String },
}

/// Everything that happens in a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EpisodeEvent {
    /// The run exists: what it runs, on what, with which pinned actions.
    RunStarted {
        workflow_id: WorkflowId,
        version: WorkflowVersion,
        input: Value,
        input_hash: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<ParentLink>,
        /// Tools pinned by reference text (`text@^0.1`).
        tools: BTreeMap<String, PinnedTool>,
        /// Verifiers pinned by reference text (step verifiers and rubric
        /// criteria).
        verifiers: BTreeMap<String, ToolIdentity>,
        /// Each sub-workflow step's child version and what the child pins,
        /// resolved when this run started: resuming, retrying or answering
        /// a judgment never resolves `latest` again.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        subworkflows: BTreeMap<StepId, PinnedChild>,
        /// The trace context of whoever started the run (an HTTP or MCP
        /// caller's W3C `traceparent`), so that the host that drives it —
        /// claimed from the queue, possibly elsewhere — continues that
        /// trace. Telemetry only: volatile, never read by the run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace: Option<TraceCarrier>,
    },
    /// A step execution began (a loop re-entry is a new iteration).
    StepStarted {
        step: StepId,
        iteration: u32,
        kind: String,
        /// The Parallel or Conditional step that runs this owned step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<StepId>,
    },
    /// An attempt of the current execution began.
    AttemptStarted {
        step: StepId,
        iteration: u32,
        attempt: u32,
    },
    /// A model call is about to be made: the whole request, durable before
    /// the provider is asked. A request with no answer recorded after it
    /// was asked and lost (the host stopped): it is asked again, and that
    /// request says `reask`.
    ModelRequested {
        step: StepId,
        iteration: u32,
        attempt: u32,
        /// Everything that reaches the provider (the rendered messages by
        /// their blob hashes): see `ModelRequest::identity`.
        request: Value,
        request_hash: String,
        /// The model the provider answers with when a step names none (not
        /// part of the request's identity, which names the model used).
        #[serde(default)]
        default_model: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reask: bool,
    },
    /// A model answered.
    ModelCalled {
        step: StepId,
        iteration: u32,
        attempt: u32,
        provider: String,
        model: String,
        /// Blob hash of the rendered prompt.
        prompt: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        system: Option<String>,
        /// The recorded state the prompt read: variable paths, sorted.
        partition: Vec<String>,
        /// Blob hash of the model's output text.
        output: String,
        /// The output text itself, so the episode alone refolds.
        text: String,
        usage: Usage,
        latency_ms: u64,
        /// The request this answers (absent in episodes recorded before
        /// requests were).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_hash: Option<String>,
    },
    /// A model call failed.
    ModelFailed {
        step: StepId,
        iteration: u32,
        attempt: u32,
        provider: String,
        failure: Failure,
    },
    /// A tool call, as a first-class step of the episode: identity,
    /// arguments, capabilities and the sandbox's hostcall record.
    ToolCalled {
        step: StepId,
        iteration: u32,
        attempt: u32,
        tool: ToolIdentity,
        effect: EffectClass,
        args: Value,
        args_hash: String,
        idempotency_key: String,
        capabilities: Vec<Capability>,
        record: Value,
        outcome: CallOutcome,
        /// Written by `reconcile`, not by a call.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reconciled: bool,
    },
    /// The verifiers of an attempt, fanned out and joined.
    Verified {
        step: StepId,
        iteration: u32,
        attempt: u32,
        verdicts: Vec<VerdictRecord>,
    },
    /// An attempt ended.
    AttemptFinished {
        step: StepId,
        iteration: u32,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// A step execution ended.
    StepFinished {
        step: StepId,
        iteration: u32,
        status: StepStatus,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        output: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
        /// What was done, on what, with what result, when.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        receipt: Option<Receipt>,
    },
    /// A declared state key changed through its reducer.
    StateWritten {
        key: String,
        reducer: Reducer,
        value: Value,
        value_hash: String,
    },
    /// A conditional's predicate was evaluated.
    ConditionEvaluated {
        step: StepId,
        iteration: u32,
        result: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chosen: Option<StepId>,
    },
    /// A parallel step fanned out.
    BranchesForked {
        step: StepId,
        iteration: u32,
        branches: Vec<StepId>,
        join: JoinPolicy,
    },
    /// A parallel step joined: who won, who lost the race, who failed.
    BranchesJoined {
        step: StepId,
        iteration: u32,
        winners: Vec<StepId>,
        losers: Vec<StepId>,
        failed: Vec<StepId>,
        /// The winners' state writes broke a contract: the step fails.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failure: Option<Failure>,
    },
    /// A rubric scored an output: a step's attempt (`step` set) or the
    /// run's result.
    RubricScored {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<StepId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iteration: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        verdict: RubricVerdict,
    },
    /// A bounded back-edge was taken.
    LoopIterated {
        from: StepId,
        to: StepId,
        taken: u32,
        body: Vec<StepId>,
    },
    /// A child run is about to be created: its id, durable before it
    /// exists, so a host that stops in between creates this one child, not
    /// another.
    ChildRunRequested {
        step: StepId,
        iteration: u32,
        attempt: u32,
        child_run: poimen_store::RunId,
        child_version: WorkflowVersion,
        input_hash: String,
    },
    /// A child run was created for a sub-workflow step.
    ChildRunLinked {
        step: StepId,
        iteration: u32,
        child_run: poimen_store::RunId,
        child_version: WorkflowVersion,
    },
    /// The child run ended.
    ChildRunFinished {
        step: StepId,
        iteration: u32,
        child_run: poimen_store::RunId,
        status: poimen_store::RunStatus,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "present"
        )]
        output: Option<Value>,
    },
    /// The run asks an external judge.
    JudgmentRequested {
        step: StepId,
        iteration: u32,
        request_id: poimen_store::JudgmentId,
        request_hash: String,
        request: Value,
        /// When the request expires unanswered (the step's timeout, or the
        /// policy's); absent: it waits until answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<i64>,
    },
    /// A judgment request's timeout passed without an answer; `fallback`
    /// says what was done (`fail`, `answer`, `escalate`).
    JudgmentExpired {
        step: StepId,
        iteration: u32,
        request_id: poimen_store::JudgmentId,
        fallback: String,
    },
    /// A judge's result passed validation.
    JudgmentReceived {
        step: StepId,
        iteration: u32,
        request_id: poimen_store::JudgmentId,
        result: Value,
        result_hash: String,
        provenance: Value,
    },
    /// The run waits for something outside it.
    RunWaiting {
        reason: String,
    },
    /// The run cannot go on without an operator.
    RunBlocked {
        step: StepId,
        iteration: u32,
        attempt: u32,
        reason: String,
    },
    /// An operator decided the outcome of a blocked tool call.
    Reconciled {
        step: StepId,
        iteration: u32,
        attempt: u32,
        decision: Reconciliation,
    },
    /// A host picked the run up again.
    RunResumed {
        reason: String,
    },
    /// An operator asked for the run to go again from `from`: these steps
    /// (and the steps they own) are reset and run as new iterations; the
    /// history before stays in the episode.
    RunRetried {
        from: StepId,
        reset: Vec<StepId>,
    },
    RunCompleted {
        output: Value,
        output_hash: String,
    },
    RunFailed {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<StepId>,
    },
    RunCancelled {
        reason: String,
    },
}

impl EpisodeEvent {
    /// The event's name, as stored in the `kind` column.
    pub fn kind(&self) -> &'static str {
        match self {
            EpisodeEvent::RunStarted { .. } => "run_started",
            EpisodeEvent::StepStarted { .. } => "step_started",
            EpisodeEvent::AttemptStarted { .. } => "attempt_started",
            EpisodeEvent::ModelRequested { .. } => "model_requested",
            EpisodeEvent::ModelCalled { .. } => "model_called",
            EpisodeEvent::ModelFailed { .. } => "model_failed",
            EpisodeEvent::ToolCalled { .. } => "tool_called",
            EpisodeEvent::Verified { .. } => "verified",
            EpisodeEvent::AttemptFinished { .. } => "attempt_finished",
            EpisodeEvent::StepFinished { .. } => "step_finished",
            EpisodeEvent::StateWritten { .. } => "state_written",
            EpisodeEvent::ConditionEvaluated { .. } => "condition_evaluated",
            EpisodeEvent::BranchesForked { .. } => "branches_forked",
            EpisodeEvent::BranchesJoined { .. } => "branches_joined",
            EpisodeEvent::LoopIterated { .. } => "loop_iterated",
            EpisodeEvent::ChildRunRequested { .. } => "child_run_requested",
            EpisodeEvent::ChildRunLinked { .. } => "child_run_linked",
            EpisodeEvent::RubricScored { .. } => "rubric_scored",
            EpisodeEvent::ChildRunFinished { .. } => "child_run_finished",
            EpisodeEvent::JudgmentRequested { .. } => "judgment_requested",
            EpisodeEvent::JudgmentReceived { .. } => "judgment_received",
            EpisodeEvent::JudgmentExpired { .. } => "judgment_expired",
            EpisodeEvent::RunWaiting { .. } => "run_waiting",
            EpisodeEvent::RunBlocked { .. } => "run_blocked",
            EpisodeEvent::Reconciled { .. } => "reconciled",
            EpisodeEvent::RunResumed { .. } => "run_resumed",
            EpisodeEvent::RunRetried { .. } => "run_retried",
            EpisodeEvent::RunCompleted { .. } => "run_completed",
            EpisodeEvent::RunFailed { .. } => "run_failed",
            EpisodeEvent::RunCancelled { .. } => "run_cancelled",
        }
    }
}

/// An optional JSON value that is there — even as `null` — when its field
/// is: `None` is written as an absent field, so a present `null` is
/// `Some(Value::Null)` (a step whose output is `null`), not `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl EpisodeEvent {
    /// The event as the JSON body a store keeps.
    ///
    /// Cannot fail: every map in an event has string keys and every enum
    /// is representable in JSON (`every_event_kind_encodes_and_decodes`
    /// checks each kind). Should a future field break that, the body names
    /// the problem and decoding it fails loudly — it never becomes `null`.
    pub fn body(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(v) => v,
            Err(e) => serde_json::json!({"event": self.kind(), "unencodable": e.to_string()}),
        }
    }

    /// The event as the JSON text a store writes: [`EpisodeEvent::body`]
    /// encoded straight to bytes, without building the `Value` first.
    pub fn encoded(&self) -> poimen_store::EventBody {
        match poimen_store::EventBody::encode(self) {
            Ok(b) => b,
            Err(e) => poimen_store::EventBody::from(
                &serde_json::json!({"event": self.kind(), "unencodable": e.to_string()}),
            ),
        }
    }

    /// The step this event is about, if any.
    pub fn step(&self) -> Option<&StepId> {
        use EpisodeEvent as E;
        match self {
            E::StepStarted { step, .. }
            | E::AttemptStarted { step, .. }
            | E::ModelRequested { step, .. }
            | E::ModelCalled { step, .. }
            | E::ModelFailed { step, .. }
            | E::ToolCalled { step, .. }
            | E::Verified { step, .. }
            | E::AttemptFinished { step, .. }
            | E::StepFinished { step, .. }
            | E::ConditionEvaluated { step, .. }
            | E::BranchesForked { step, .. }
            | E::BranchesJoined { step, .. }
            | E::ChildRunRequested { step, .. }
            | E::ChildRunLinked { step, .. }
            | E::ChildRunFinished { step, .. }
            | E::JudgmentRequested { step, .. }
            | E::JudgmentReceived { step, .. }
            | E::JudgmentExpired { step, .. }
            | E::RunBlocked { step, .. }
            | E::Reconciled { step, .. } => Some(step),
            E::RunFailed { step, .. } | E::RubricScored { step, .. } => step.as_ref(),
            E::RunStarted { .. }
            | E::StateWritten { .. }
            | E::LoopIterated { .. }
            | E::RunWaiting { .. }
            | E::RunResumed { .. }
            | E::RunRetried { .. }
            | E::RunCompleted { .. }
            | E::RunCancelled { .. } => None,
        }
    }
}

/// An event as recorded: its place in the run and when it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    pub seq: u64,
    /// Milliseconds since the Unix epoch (volatile).
    pub at: i64,
    #[serde(flatten)]
    pub event: EpisodeEvent,
}

/// The receipt of one step execution: enough to say what acted, on which
/// input, with which result, when, and on which attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The attempt that ended the execution (1-based; 0 when it stopped
    /// before an attempt began).
    pub attempt: u32,
    /// `tool:NAME@VERSION DIGEST`, `model:PROVIDER/MODEL`, or the step kind
    /// for steps that call nothing themselves (`parallel`, `conditional`,
    /// `sub_workflow`, `judgment`).
    pub action: String,
    /// Blake3 of what the action consumed (tool arguments, prompt blob), if
    /// it consumed anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_hash: Option<String>,
    /// Blake3 of the canonical JSON of the step's output, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_hash: Option<String>,
    /// Milliseconds since the Unix epoch (volatile).
    pub started_at: i64,
    /// Milliseconds since the Unix epoch (volatile).
    pub finished_at: i64,
}

impl Recorded {
    /// The event as the store takes it.
    pub fn to_new_event(&self) -> poimen_store::NewEvent {
        poimen_store::NewEvent {
            seq: self.seq,
            at: self.at,
            kind: self.event.kind().to_owned(),
            body: self.event.encoded(),
        }
    }

    /// The recorded event as JSON (`seq`, `at` and the event's fields).
    pub fn to_json(&self) -> Value {
        let mut v = self.event.body();
        if let Some(obj) = v.as_object_mut() {
            obj.insert("seq".into(), Value::from(self.seq));
            obj.insert("at".into(), Value::from(self.at));
        }
        v
    }
}

/// A run's events in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Episode {
    pub run: String,
    pub events: Vec<Recorded>,
}

/// Why stored events do not form an episode.
#[derive(Debug, thiserror::Error)]
pub enum EpisodeError {
    #[error(
        "event {seq} of run {run} is not a poimen episode event ({cause}); the store holds data this version cannot read"
    )]
    Undecodable {
        run: String,
        seq: u64,
        cause: String,
    },
}

impl Episode {
    /// Decodes stored events.
    pub fn from_stored(
        run: &str,
        stored: &[poimen_store::StoredEvent],
    ) -> Result<Episode, EpisodeError> {
        let events = stored
            .iter()
            .map(|s| {
                serde_json::from_value::<EpisodeEvent>(s.body.clone())
                    .map(|event| Recorded {
                        seq: s.seq,
                        at: s.at,
                        event,
                    })
                    .map_err(|e| EpisodeError::Undecodable {
                        run: run.to_owned(),
                        seq: s.seq,
                        cause: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Episode {
            run: run.to_owned(),
            events,
        })
    }
}

/// Fields of a serialized episode that legitimately differ between two runs
/// of the same workflow on the same input: ids minted per run, wall-clock
/// times and durations. This is the whole list — the normalizer blanks these
/// and nothing else, so it cannot quietly grow into "anything that differs".
pub const VOLATILE_FIELDS: &[&str] = &[
    // when each event happened
    "at",
    // ids minted per run
    "run",
    "child_run",
    "request_id",
    "parent.run",
    // when a step execution began and ended
    "receipt.started_at",
    "receipt.finished_at",
    // derived from the run id
    "idempotency_key",
    // measured durations
    "latency_ms",
    // the starter's trace context
    "trace",
];

/// Fields of a hostcall record (inside `record` of tool and verifier calls)
/// that are measured rather than determined.
pub const VOLATILE_RECORD_FIELDS: &[&str] = &[
    "wall_time_us",
    "idempotency_key",
    // the guest's random seed derives from the idempotency key, and what a
    // guest does with random numbers (a hash map's layout) moves its fuel
    "fuel_consumed",
    // and its memory (a map that grew one more time)
    "memory_peak_bytes",
];

/// Placeholder written over a volatile field.
pub const VOLATILE: &str = "<volatile>";

/// The positions of the episode's events in canonical order, each with
/// whether it lies inside a fan-out.
///
/// Recorded order, except inside a fan-out — from a `branches_forked` to the
/// matching `branches_joined` of the same step and iteration (or the end of
/// the episode, if the run stopped mid-fan-out): there branches run
/// concurrently and their events interleave in completion order, so the
/// window's events are grouped by step id (ids sorted, each step's own
/// events in recorded order). Only this order is the same from run to run.
pub fn canonical_order(episode: &Episode) -> Vec<(usize, bool)> {
    let events = &episode.events;
    let mut out = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        out.push((i, false));
        if let EpisodeEvent::BranchesForked {
            step, iteration, ..
        } = &events[i].event
        {
            let end = events[i + 1..]
                .iter()
                .position(|r| {
                    matches!(&r.event, EpisodeEvent::BranchesJoined { step: s, iteration: it, .. }
                        if s == step && it == iteration)
                })
                .map_or(events.len(), |p| i + 1 + p);
            let mut window: Vec<(String, usize)> = (i + 1..end)
                .map(|k| {
                    let step = events[k].event.step().map(|s| s.0.clone());
                    (step.unwrap_or_default(), k)
                })
                .collect();
            // Stable: each step's events keep their recorded order.
            window.sort_by(|a, b| a.0.cmp(&b.0));
            out.extend(window.into_iter().map(|(_, k)| (k, true)));
            if end < events.len() {
                out.push((end, false));
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The episode as JSON, in [`canonical_order`], with exactly the
/// [`VOLATILE_FIELDS`] (and [`VOLATILE_RECORD_FIELDS`] inside hostcall
/// records) replaced by [`VOLATILE`] — and, inside a fan-out, `seq`, which
/// there records completion order. Two runs of one workflow on one input
/// normalize equal.
pub fn normalize(episode: &Episode) -> Value {
    let mut events = Vec::with_capacity(episode.events.len());
    for (k, in_fanout) in canonical_order(episode) {
        let r = &episode.events[k];
        let mut v = r.to_json();
        blank(&mut v, VOLATILE_FIELDS);
        if in_fanout {
            blank(&mut v, &["seq"]);
        }
        if let Some(obj) = v.as_object_mut() {
            if let Some(record) = obj.get_mut("record") {
                blank(record, VOLATILE_RECORD_FIELDS);
            }
            if let Some(Value::Array(verdicts)) = obj.get_mut("verdicts") {
                for verdict in verdicts {
                    if let Some(record) = verdict.get_mut("record") {
                        blank(record, VOLATILE_RECORD_FIELDS);
                    }
                }
            }
        }
        events.push(v);
    }
    Value::Array(events)
}

/// Blanks each field, given as a dotted path from `v`.
fn blank(v: &mut Value, fields: &[&str]) {
    for path in fields {
        let mut slot = Some(&mut *v);
        for part in path.split('.') {
            slot = slot
                .and_then(|s| s.as_object_mut())
                .and_then(|o| o.get_mut(part));
        }
        if let Some(slot) = slot {
            *slot = Value::String(VOLATILE.to_owned());
        }
    }
}

/// The episode's structure: per event, in [`canonical_order`], its kind and
/// step/iteration/attempt/status — what "identical episode structure"
/// compares.
pub fn structure(episode: &Episode) -> Vec<String> {
    canonical_order(episode)
        .into_iter()
        .map(|(k, _)| &episode.events[k])
        .map(|r| {
            let v = r.event.body();
            let mut line = r.event.kind().to_owned();
            for key in ["step", "iteration", "attempt", "status"] {
                if let Some(x) = v.get(key) {
                    let x = match x {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    line.push_str(&format!(" {key}={x}"));
                }
            }
            line
        })
        .collect()
}

/// A caller's trace context as its propagator's fields (for W3C trace
/// context, `traceparent` and `tracestate`), recorded with a run's start.
pub type TraceCarrier = std::collections::BTreeMap<String, String>;

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, event: EpisodeEvent) -> Recorded {
        Recorded { seq, at: 0, event }
    }

    fn started(step: &str) -> EpisodeEvent {
        EpisodeEvent::AttemptStarted {
            step: StepId::from(step),
            iteration: 1,
            attempt: 1,
        }
    }

    fn finished(step: &str) -> EpisodeEvent {
        EpisodeEvent::AttemptFinished {
            step: StepId::from(step),
            iteration: 1,
            attempt: 1,
            failure: None,
        }
    }

    fn fanout(order: [EpisodeEvent; 4]) -> Episode {
        let p = StepId::from("p");
        let mut events = vec![rec(
            0,
            EpisodeEvent::BranchesForked {
                step: p.clone(),
                iteration: 1,
                branches: vec![StepId::from("a"), StepId::from("b")],
                join: JoinPolicy::default(),
            },
        )];
        for (i, e) in order.into_iter().enumerate() {
            events.push(rec(i as u64 + 1, e));
        }
        events.push(rec(
            5,
            EpisodeEvent::BranchesJoined {
                step: p,
                iteration: 1,
                winners: vec![StepId::from("a"), StepId::from("b")],
                losers: vec![],
                failed: vec![],
                failure: None,
            },
        ));
        events.push(rec(6, started("after")));
        Episode {
            run: "WFR-x".into(),
            events,
        }
    }

    /// One event of every kind, with every optional field set.
    fn one_of_each() -> Vec<EpisodeEvent> {
        use crate::effects::{Failure, FailureClass, ToolIdentity, Usage, Verdict};
        use serde_json::json;
        let s = || StepId::from("s");
        let run = poimen_store::RunId::generate(poimen_store::Ulid::from_parts(1, 2));
        let jid = poimen_store::JudgmentId::generate(poimen_store::Ulid::from_parts(3, 4));
        let tool = ToolIdentity {
            name: "t".into(),
            version: "1.0.0".into(),
            digest: "b3:00".into(),
        };
        let failure = Failure::new(FailureClass::Failed, "no");
        let version = WorkflowVersion([7; 32]);
        let mut tools = BTreeMap::new();
        tools.insert(
            "t@^1".to_owned(),
            PinnedTool {
                identity: tool.clone(),
                effect: EffectClass::Idempotent,
                workflow: None,
            },
        );
        let all = vec![
            EpisodeEvent::RunStarted {
                workflow_id: WorkflowId::from("w"),
                version,
                input: json!({"a": [1, 2.5, null]}),
                input_hash: "b3:01".into(),
                parent: Some(ParentLink {
                    run: run.clone(),
                    step: s(),
                    iteration: 1,
                }),
                tools: tools.clone(),
                verifiers: BTreeMap::from([("v@^1".to_owned(), tool.clone())]),
                subworkflows: BTreeMap::from([(
                    s(),
                    PinnedChild {
                        version,
                        pins: Pins {
                            tools,
                            verifiers: BTreeMap::new(),
                            subworkflows: BTreeMap::new(),
                        },
                    },
                )]),
                trace: Some(BTreeMap::from([(
                    "traceparent".to_owned(),
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
                )])),
            },
            EpisodeEvent::ModelRequested {
                step: s(),
                iteration: 1,
                attempt: 1,
                request: json!({"model": "m", "prompt": "b3:02"}),
                request_hash: "b3:0d".into(),
                default_model: "m".into(),
                reask: true,
            },
            EpisodeEvent::StepStarted {
                step: s(),
                iteration: 1,
                kind: "tool".into(),
                owner: Some(s()),
            },
            EpisodeEvent::AttemptStarted {
                step: s(),
                iteration: 1,
                attempt: 1,
            },
            EpisodeEvent::ModelCalled {
                step: s(),
                iteration: 1,
                attempt: 1,
                provider: "p".into(),
                model: "m".into(),
                prompt: "b3:02".into(),
                system: Some("b3:03".into()),
                partition: vec!["inputs.a".into()],
                output: "b3:04".into(),
                text: "hi".into(),
                usage: Usage {
                    tokens_in: 1,
                    tokens_out: 2,
                },
                latency_ms: 3,
                request_hash: Some("b3:0d".into()),
            },
            EpisodeEvent::ModelFailed {
                step: s(),
                iteration: 1,
                attempt: 1,
                provider: "p".into(),
                failure: failure.clone(),
            },
            EpisodeEvent::ToolCalled {
                step: s(),
                iteration: 1,
                attempt: 1,
                tool: tool.clone(),
                effect: EffectClass::NonIdempotent,
                args: json!({}),
                args_hash: "b3:05".into(),
                idempotency_key: "ik".into(),
                capabilities: vec![poimen_workflow::Capability::Scratch],
                record: json!({"x": 1}),
                outcome: CallOutcome::Ok {
                    output: Arc::new(json!(1)),
                    output_hash: "b3:06".into(),
                },
                reconciled: true,
            },
            EpisodeEvent::Verified {
                step: s(),
                iteration: 1,
                attempt: 1,
                verdicts: vec![
                    VerdictRecord {
                        verifier: tool.clone(),
                        config: json!(null),
                        outcome: VerdictOutcome::Verdict(Verdict {
                            pass: true,
                            score: 0.5,
                            reason: "ok".into(),
                        }),
                        record: json!({}),
                    },
                    VerdictRecord {
                        verifier: tool.clone(),
                        config: json!({"k": "v"}),
                        outcome: VerdictOutcome::Err {
                            failure: failure.clone(),
                        },
                        record: json!({}),
                    },
                ],
            },
            EpisodeEvent::AttemptFinished {
                step: s(),
                iteration: 1,
                attempt: 1,
                failure: Some(failure.clone()),
            },
            EpisodeEvent::StepFinished {
                step: s(),
                iteration: 1,
                status: StepStatus::Lost,
                output: Some(json!(null)),
                failure: Some(failure.clone()),
                receipt: Some(Receipt {
                    attempt: 1,
                    action: "tool:t@1.0.0 b3:00".into(),
                    input_hash: Some("b3:07".into()),
                    output_hash: Some("b3:08".into()),
                    started_at: 1,
                    finished_at: 2,
                }),
            },
            EpisodeEvent::StateWritten {
                key: "k".into(),
                reducer: Reducer::Union,
                value: json!([1]),
                value_hash: "b3:09".into(),
            },
            EpisodeEvent::ConditionEvaluated {
                step: s(),
                iteration: 1,
                result: false,
                chosen: Some(s()),
            },
            EpisodeEvent::BranchesForked {
                step: s(),
                iteration: 1,
                branches: vec![s()],
                join: JoinPolicy::Quorum(2),
            },
            EpisodeEvent::BranchesJoined {
                step: s(),
                iteration: 1,
                winners: vec![s()],
                losers: vec![s()],
                failed: vec![s()],
                failure: Some(Failure::contract(crate::effects::Contract::Reducer {
                    key: "k".into(),
                    reducer: Reducer::Merge,
                    value: crate::effects::JsonType::Object,
                    write: crate::effects::JsonType::String,
                })),
            },
            EpisodeEvent::LoopIterated {
                from: s(),
                to: s(),
                taken: 1,
                body: vec![s()],
            },
            EpisodeEvent::ChildRunRequested {
                step: s(),
                iteration: 1,
                attempt: 1,
                child_run: run.clone(),
                child_version: version,
                input_hash: "b3:0e".into(),
            },
            EpisodeEvent::ChildRunLinked {
                step: s(),
                iteration: 1,
                child_run: run.clone(),
                child_version: version,
            },
            EpisodeEvent::RubricScored {
                step: Some(s()),
                iteration: Some(1),
                attempt: Some(1),
                verdict: RubricVerdict {
                    criteria: vec![CriterionVerdict {
                        criterion: "c".into(),
                        weight: 2.0,
                        verifier: tool.clone(),
                        outcome: VerdictOutcome::Verdict(Verdict {
                            pass: true,
                            score: 0.75,
                            reason: "r".into(),
                        }),
                        record: json!({}),
                    }],
                    score: 0.75,
                    threshold: Some(0.7),
                    passed: true,
                },
            },
            EpisodeEvent::ChildRunFinished {
                step: s(),
                iteration: 1,
                child_run: run,
                status: poimen_store::RunStatus::Failed,
                output: Some(json!(null)),
            },
            EpisodeEvent::JudgmentRequested {
                step: s(),
                iteration: 1,
                request_id: jid.clone(),
                request_hash: "b3:0a".into(),
                request: json!({"q": 1}),
                expires_at: Some(5),
            },
            EpisodeEvent::JudgmentExpired {
                step: s(),
                iteration: 1,
                request_id: jid.clone(),
                fallback: "escalate".into(),
            },
            EpisodeEvent::JudgmentReceived {
                step: s(),
                iteration: 1,
                request_id: jid,
                result: json!(true),
                result_hash: "b3:0b".into(),
                provenance: json!({"judge": "j"}),
            },
            EpisodeEvent::RunWaiting { reason: "r".into() },
            EpisodeEvent::RunBlocked {
                step: s(),
                iteration: 1,
                attempt: 1,
                reason: "r".into(),
            },
            EpisodeEvent::Reconciled {
                step: s(),
                iteration: 1,
                attempt: 1,
                decision: Reconciliation::Failed { reason: "r".into() },
            },
            EpisodeEvent::RunResumed { reason: "r".into() },
            EpisodeEvent::RunRetried {
                from: s(),
                reset: vec![s()],
            },
            EpisodeEvent::RunCompleted {
                output: json!({"o": 1}),
                output_hash: "b3:0c".into(),
            },
            EpisodeEvent::RunFailed {
                reason: "r".into(),
                step: Some(s()),
            },
            EpisodeEvent::RunCancelled { reason: "r".into() },
        ];
        all
    }

    #[test]
    fn every_event_kind_encodes_and_decodes() {
        let all = one_of_each();
        let mut kinds: Vec<&str> = all.iter().map(EpisodeEvent::kind).collect();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds.len(), all.len(), "one event of each kind");
        // Every kind `EpisodeEvent::kind` knows: add a new kind above.
        assert_eq!(kinds.len(), 30);
        for event in all {
            let body = event.body();
            assert!(body.get("unencodable").is_none(), "{body}");
            assert_eq!(body["event"], serde_json::json!(event.kind()));
            // The text a store writes is the same body, and decodes too.
            let text = event.encoded();
            assert_eq!(text.to_value().expect("parses"), body);
            let back: EpisodeEvent = serde_json::from_str(text.as_str()).expect("decodes");
            assert_eq!(back, event);
            let back: EpisodeEvent = serde_json::from_value(body).expect("decodes");
            assert_eq!(back, event);
        }
    }

    #[test]
    fn interleavings_of_one_fanout_have_one_structure_and_one_normal_form() {
        let x = fanout([started("b"), started("a"), finished("a"), finished("b")]);
        let y = fanout([started("a"), started("b"), finished("b"), finished("a")]);
        assert_eq!(structure(&x), structure(&y));
        assert_eq!(normalize(&x), normalize(&y));
        let s = structure(&x);
        assert_eq!(s[1], "attempt_started step=a iteration=1 attempt=1");
        assert_eq!(s[2], "attempt_finished step=a iteration=1 attempt=1");
        assert_eq!(s[5], "branches_joined step=p iteration=1");
        // Outside a fan-out, order is recorded order and seq is kept.
        assert_eq!(normalize(&x)[6]["seq"], serde_json::json!(6));
    }

    #[test]
    fn a_fanout_cut_short_by_a_crash_still_orders_canonically() {
        let mut x = fanout([started("b"), started("a"), finished("a"), finished("b")]);
        x.events.truncate(4);
        let order: Vec<usize> = canonical_order(&x).into_iter().map(|(k, _)| k).collect();
        assert_eq!(order, vec![0, 2, 3, 1]);
    }
}
