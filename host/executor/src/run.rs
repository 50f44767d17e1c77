//! The walk: one run, interpreted step by step over the IR.
//!
//! A run is driven by [`RunCtx::drive`]: top-level steps one at a time in
//! deterministic topological order, fan-out only inside a `Parallel` step,
//! attempts strictly serial, the verifiers of one attempt fanned out and
//! joined. Every change is recorded as an episode event *before* it is
//! applied to the in-memory state, and every tool call goes through the
//! write-ahead intent wrapper ([`RunCtx::call_tool`]) — there is no other
//! path from here to a tool.
//!
//! The walk is re-entrant: resuming a run refolds its episode and walks
//! again, and every effect already recorded for the current attempt (tool
//! outcome, model answer, verdicts, conditional choice, fork, child run,
//! judgment) is replayed from the record instead of being performed again.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use store::{
    BlobHash, Commit, Durability, IntentPhase, IntentRecord, NewEvent, RunId, RunStatus, RunUpdate,
    Store,
};
use workflow::{
    EffectClass, JoinPolicy, OutputFormat, StepDef, StepId, StepKind, ToolRef, WorkflowVersion,
};

use crate::crash::crash_point;
use crate::effects::{Failure, FailureClass, ModelRequest, ToolCall, VerifierCall};
use crate::engine::Inner;
use crate::episode::{
    CallOutcome, EpisodeEvent, ParentLink, Receipt, Recorded, StepStatus, VerdictOutcome,
    VerdictRecord,
};
use crate::hash::{canonical_json, hash_bytes, hash_json, idempotency_key};
use crate::plan::Armed;
use crate::render::{RenderError, context, eval_predicate, render_args, render_text};
use crate::scope::{RunScope, Stop};
use crate::state::{RunState, reduce};

/// How a step execution ended, when the run goes on.
#[derive(Debug, Clone)]
pub(crate) enum StepEnd {
    Completed(Value),
    Failed(Failure),
    /// A parallel branch cancelled because its join was decided.
    Lost,
}

/// Everything one store commit writes for a run.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub events: Vec<EpisodeEvent>,
    pub intents: Vec<IntentRecord>,
    pub judgments: Vec<store::JudgmentWrite>,
    pub blobs: Vec<Vec<u8>>,
    pub update: Option<(RunStatus, Option<String>, Option<BlobHash>)>,
    pub durability: Durability,
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
    /// The run must fail now (budget, limits, a postcondition).
    Fail {
        reason: String,
        step: Option<StepId>,
    },
    /// The store refused a write: nothing more can be recorded.
    Store(store::StoreError),
    /// The episode contradicts itself or the workflow.
    Internal(String),
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

/// One run being driven by this host.
pub(crate) struct RunCtx {
    pub exec: Arc<Inner>,
    pub store: Arc<dyn Store>,
    pub run: RunId,
    pub armed: Arc<Armed>,
    pub scope: RunScope,
    /// Sub-workflow nesting depth of this run (0 for a top-level run).
    pub depth: u32,
    state: tokio::sync::Mutex<RunState>,
    /// Intent phases recorded per (step, iteration, attempt).
    intents: std::sync::Mutex<BTreeMap<(StepId, u32, u32), Vec<IntentPhase>>>,
    /// Records the next commit carries ahead of its own (see [`Deferred`]).
    deferred: std::sync::Mutex<Deferred>,
}

/// Records queued for the run's next commit, which carries them ahead of its
/// own. On the serial spine (never inside a fan-out, whose branches commit
/// concurrently) a top-level tool step's start rides with its `Pending`
/// intent, and its `Committed`/`Failed` intent with the step's end: a
/// durable tool step costs three store commits, two of them fsynced.
///
/// Nothing queued is applied until that commit, so a crash before it leaves
/// no trace of it — as if it never happened. For a start that is true:
/// nothing but it happened. For a tool call's outcome the recorded
/// `Dispatched` intent stands for it, which recovery treats as it treats a
/// crash just after the call (re-dispatch under the same idempotency key, or
/// `outcome_unknown` for a non-idempotent tool).
#[derive(Debug, Default)]
struct Deferred {
    events: Vec<EpisodeEvent>,
    intents: Vec<IntentRecord>,
    /// The carrying commit is fsynced whatever it asks for: an intent's
    /// outcome is durable before the run moves on.
    sync: bool,
    /// Crash-injection points reached once the carrying commit returns.
    crash_after: Vec<&'static str>,
}

impl std::fmt::Debug for RunCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCtx")
            .field("run", &self.run)
            .field("depth", &self.depth)
            .finish()
    }
}

type StepFuture = BoxFuture<'static, Result<StepEnd, Halt>>;

impl RunCtx {
    /// Everything a run needs is handed in at once, from the engine's one
    /// call site; a parameter struct would only rename these.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        exec: Arc<Inner>,
        store: Arc<dyn Store>,
        run: RunId,
        armed: Arc<Armed>,
        scope: RunScope,
        depth: u32,
        state: RunState,
        intents: &[IntentRecord],
    ) -> Arc<RunCtx> {
        let mut phases: BTreeMap<(StepId, u32, u32), Vec<IntentPhase>> = BTreeMap::new();
        for i in intents {
            phases
                .entry((i.step.clone(), i.iteration, i.attempt))
                .or_default()
                .push(i.phase);
        }
        Arc::new(RunCtx {
            exec,
            store,
            run,
            armed,
            scope,
            depth,
            state: tokio::sync::Mutex::new(state),
            intents: std::sync::Mutex::new(phases),
            deferred: std::sync::Mutex::new(Deferred::default()),
        })
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Deferred> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues events for the next commit (see [`Deferred`]).
    fn defer(&self, events: Vec<EpisodeEvent>) {
        self.deferred().events.extend(events);
    }

    /// Queues a tool call's outcome for the next commit, which is then
    /// fsynced (see [`Deferred`]); `crash_after` is reached once it is.
    fn defer_outcome(
        &self,
        events: Vec<EpisodeEvent>,
        intents: Vec<IntentRecord>,
        crash_after: &'static str,
    ) {
        let mut d = self.deferred();
        d.events.extend(events);
        d.intents.extend(intents);
        d.sync = true;
        d.crash_after.push(crash_after);
    }

    /// A copy of the current state.
    pub async fn snapshot(&self) -> RunState {
        self.state.lock().await.clone()
    }

    /// The state as it will be once the queued records are committed.
    async fn preview(&self) -> Result<RunState, Halt> {
        let mut state = self.snapshot().await;
        let events = self.deferred().events.clone();
        let at = self.exec.clock.now_ms();
        let first = state.last_seq.map_or(0, |s| s + 1);
        for (i, event) in events.into_iter().enumerate() {
            state
                .apply(&Recorded {
                    seq: first + i as u64,
                    at,
                    event,
                })
                .map_err(|e| Halt::Internal(e.to_string()))?;
        }
        Ok(state)
    }

    /// Records events (and intents, and a run-status change) in one commit,
    /// then applies the events to the live state. Nothing is applied unless
    /// it was recorded.
    pub async fn record(
        &self,
        events: Vec<EpisodeEvent>,
        intents: Vec<IntentRecord>,
        update: Option<(RunStatus, Option<String>, Option<BlobHash>)>,
        durability: Durability,
    ) -> Result<(), Halt> {
        self.commit(Batch {
            events,
            intents,
            update,
            durability,
            ..Batch::default()
        })
        .await
    }

    /// Records one batch in one store commit, then applies its events.
    pub async fn commit(&self, batch: Batch) -> Result<(), Halt> {
        let mut state = self.state.lock().await;
        let at = self.exec.clock.now_ms();
        let first = state.last_seq.map_or(0, |s| s + 1);
        let deferred = std::mem::take(&mut *self.deferred());
        let mut events = deferred.events;
        events.extend(batch.events);
        let mut intents = deferred.intents;
        intents.extend(batch.intents);
        let durability = if deferred.sync {
            Durability::Sync
        } else {
            batch.durability
        };
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
            run: self.run.clone(),
            blobs: batch.blobs,
            events: recorded
                .iter()
                .map(|r| NewEvent {
                    seq: r.seq,
                    at: r.at,
                    kind: r.event.kind().to_owned(),
                    body: serde_json::to_value(&r.event).unwrap_or(Value::Null),
                })
                .collect(),
            intents: intents.clone(),
            judgments: batch.judgments,
            run_update: batch.update.map(|(status, reason, output_hash)| RunUpdate {
                status,
                reason,
                output_hash,
                updated_at: at,
            }),
            durability,
        };
        self.store.commit(commit).await.map_err(Halt::Store)?;
        for r in &recorded {
            state.apply(r).map_err(|e| Halt::Internal(e.to_string()))?;
        }
        drop(state);
        if !intents.is_empty() {
            let mut phases = self.intents.lock().unwrap_or_else(|p| p.into_inner());
            for i in intents {
                phases
                    .entry((i.step, i.iteration, i.attempt))
                    .or_default()
                    .push(i.phase);
            }
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

    /// Drives the run until it ends or must wait.
    pub fn drive(self: Arc<Self>) -> BoxFuture<'static, RunOutcome> {
        async move {
            let halt = self.clone().walk().await;
            self.conclude(halt).await
        }
        .boxed()
    }

    async fn walk(self: Arc<Self>) -> Result<(), Halt> {
        loop {
            if self.scope.stopped().is_some() {
                return Err(Halt::Cancelled);
            }
            let snap = self.snapshot().await;
            match snap.status {
                Some(RunStatus::Running) => {}
                Some(RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled) => {
                    return Ok(());
                }
                Some(RunStatus::WaitingJudgment) => return Err(Halt::Waiting),
                Some(RunStatus::Blocked) => return Err(Halt::Blocked),
                Some(RunStatus::Queued) | None => {
                    return Err(Halt::Internal("the run was never started".into()));
                }
            }
            self.check_limits(&snap)?;
            let next = self.armed.shape.topo.iter().find(|id| {
                let st = snap.steps.get(*id);
                let status = st.map(|s| s.status).unwrap_or_default();
                if matches!(status, StepStatus::Running | StepStatus::Waiting) {
                    return true;
                }
                status == StepStatus::Pending
                    && self
                        .armed
                        .shape
                        .preds
                        .get(*id)
                        .into_iter()
                        .flatten()
                        .all(|p| {
                            snap.steps
                                .get(p)
                                .is_some_and(|s| s.status == StepStatus::Completed)
                        })
            });
            let Some(next) = next.cloned() else {
                return self.complete(&snap).await;
            };
            match self
                .clone()
                .exec_step(next.clone(), None, self.scope.clone())
                .await?
            {
                StepEnd::Completed(_) => self.maybe_loop(&next).await?,
                StepEnd::Failed(f) => {
                    return Err(Halt::Fail {
                        reason: format!("step `{next}` failed: {f}"),
                        step: Some(next),
                    });
                }
                StepEnd::Lost => return Err(Halt::Cancelled),
            }
        }
    }

    fn check_limits(&self, snap: &RunState) -> Result<(), Halt> {
        let def = &self.armed.def;
        let now = self.exec.clock.now_ms();
        let elapsed = u64::try_from(now.saturating_sub(snap.started_at)).unwrap_or(0);
        let fail = |reason: String| Err(Halt::Fail { reason, step: None });
        if let Some(deadline) = def.limits.deadline
            && elapsed > deadline.0
        {
            return fail(format!(
                "deadline exceeded: the run started {elapsed} ms ago and its limit is {} ms",
                deadline.0
            ));
        }
        if let Some(max) = def.budget.wall_time {
            let active = elapsed.saturating_sub(snap.spent.waiting_ms);
            if active > max.0 {
                return fail(format!(
                    "budget exceeded: wall time {active} ms is over the budget of {} ms",
                    max.0
                ));
            }
        }
        if let Some(max) = def.budget.tokens
            && snap.spent.tokens > max
        {
            return fail(format!(
                "budget exceeded: {} tokens used, the budget is {max}",
                snap.spent.tokens
            ));
        }
        if let Some(max) = def.budget.tool_calls
            && snap.spent.tool_calls > max
        {
            return fail(format!(
                "budget exceeded: {} tool calls made, the budget is {max}",
                snap.spent.tool_calls
            ));
        }
        Ok(())
    }

    /// Takes the back-edge leaving `from`, if it is bounded and still open.
    async fn maybe_loop(&self, from: &StepId) -> Result<(), Halt> {
        let Some(edge) = self.armed.shape.back_edges.get(from) else {
            return Ok(());
        };
        let Some(max) = edge.max_iterations else {
            return Ok(());
        };
        let snap = self.snapshot().await;
        let taken = snap.loops.get(from).copied().unwrap_or(0);
        if taken >= max.get() {
            return Ok(());
        }
        if let Some(when) = &edge.when {
            let go = eval_predicate(&when.0, &context(&snap)).map_err(|e| Halt::Fail {
                reason: format!(
                    "the loop condition from `{from}` to `{}` failed: {e}",
                    edge.to
                ),
                step: Some(from.clone()),
            })?;
            if !go {
                return Ok(());
            }
        }
        let body = self.armed.shape.loop_body(from, &edge.to);
        self.record(
            vec![EpisodeEvent::LoopIterated {
                from: from.clone(),
                to: edge.to.clone(),
                taken: taken + 1,
                body,
            }],
            Vec::new(),
            None,
            Durability::Buffered,
        )
        .await
    }

    /// All top-level steps completed: build, check and record the output.
    async fn complete(&self, snap: &RunState) -> Result<(), Halt> {
        let def = &self.armed.def;
        let output = match &def.output {
            Some(t) => render_args(&t.0, &context(snap)).map_err(|e| Halt::Fail {
                reason: format!("the run's output template failed: {e}"),
                step: None,
            })?,
            None => snap
                .completed_order
                .last()
                .and_then(|s| snap.steps.get(s))
                .and_then(|s| s.output.clone())
                .unwrap_or(Value::Null),
        };
        if let Some(schema) = &def.outputs
            && let Err(problems) = check_schema(schema, &output)
        {
            return Err(Halt::Fail {
                reason: format!(
                    "the run's output does not match the workflow's `outputs` schema: {problems}"
                ),
                step: None,
            });
        }
        let bytes = canonical_json(&output);
        let blob = BlobHash::of(&bytes);
        self.commit(Batch {
            events: vec![EpisodeEvent::RunCompleted {
                output,
                output_hash: blob.to_string(),
            }],
            blobs: vec![bytes],
            update: Some((RunStatus::Completed, None, Some(blob))),
            durability: Durability::Sync,
            ..Batch::default()
        })
        .await
    }

    /// Turns how the walk stopped into a recorded run status.
    async fn conclude(&self, result: Result<(), Halt>) -> RunOutcome {
        let outcome_of = |s: &RunState| RunOutcome {
            run: self.run.clone(),
            status: s.status.unwrap_or(RunStatus::Running),
            output: s.output.clone(),
            reason: s.reason.clone(),
            state: s.clone(),
        };
        let written = match result {
            Ok(()) | Err(Halt::Waiting) | Err(Halt::Blocked) => Ok(()),
            Err(Halt::Cancelled) => {
                let reason = "cancelled by request".to_owned();
                self.record(
                    vec![EpisodeEvent::RunCancelled {
                        reason: reason.clone(),
                    }],
                    Vec::new(),
                    Some((RunStatus::Cancelled, Some(reason), None)),
                    Durability::Sync,
                )
                .await
            }
            Err(Halt::Fail { reason, step }) => {
                self.record(
                    vec![EpisodeEvent::RunFailed {
                        reason: reason.clone(),
                        step,
                    }],
                    Vec::new(),
                    Some((RunStatus::Failed, Some(reason), None)),
                    Durability::Sync,
                )
                .await
            }
            Err(Halt::Internal(msg)) => {
                let reason = format!("internal error: {msg}");
                self.record(
                    vec![EpisodeEvent::RunFailed {
                        reason: reason.clone(),
                        step: None,
                    }],
                    Vec::new(),
                    Some((RunStatus::Failed, Some(reason), None)),
                    Durability::Sync,
                )
                .await
            }
            Err(h @ Halt::Store(_)) => Err(h),
        };
        match written {
            Ok(()) => outcome_of(&self.snapshot().await),
            // The store cannot take writes: report the cause; the stored run
            // keeps its last recorded status (never a false success) and is
            // recovered when the store is writable again.
            Err(Halt::Store(e)) => {
                let mut o = outcome_of(&self.snapshot().await);
                o.reason = Some(format!(
                    "the store refused a write, the run stopped where its episode ends: {e}"
                ));
                o
            }
            Err(other) => {
                let mut o = outcome_of(&self.snapshot().await);
                o.reason = Some(format!("{other:?}"));
                o
            }
        }
    }

    // ----- steps -------------------------------------------------------

    /// Executes (or resumes) one step execution: its attempts, verifiers,
    /// retries, and its state write.
    pub fn exec_step(
        self: Arc<Self>,
        id: StepId,
        owner: Option<StepId>,
        scope: RunScope,
    ) -> StepFuture {
        async move {
            let Some(def) = self.armed.step(&id).cloned() else {
                return Err(Halt::Internal(format!(
                    "step `{id}` is not in the workflow"
                )));
            };
            let snap = self.snapshot().await;
            let st = snap.steps.get(&id).cloned().unwrap_or_default();
            let (iteration, mut attempt) =
                if matches!(st.status, StepStatus::Running | StepStatus::Waiting) {
                    (st.iteration, st.attempt)
                } else {
                    if let Some(max) = self.armed.def.limits.steps
                        && snap.spent.step_executions >= u64::from(max)
                    {
                        return Err(Halt::Fail {
                            reason: format!(
                                "limit reached: the run has executed {} steps, its limit is {max}",
                                snap.spent.step_executions
                            ),
                            step: Some(id),
                        });
                    }
                    let iteration = st.iteration + 1;
                    let start = vec![
                        EpisodeEvent::StepStarted {
                            step: id.clone(),
                            iteration,
                            kind: def.kind.name().to_owned(),
                            owner: owner.clone(),
                        },
                        EpisodeEvent::AttemptStarted {
                            step: id.clone(),
                            iteration,
                            attempt: 1,
                        },
                    ];
                    // A top-level tool step's start is committed with its `Pending`
                    // intent: one store commit fewer per tool step. (Not inside a
                    // fan-out, where the step limit counts starts as they happen.)
                    if matches!(def.kind, StepKind::Tool(_)) && owner.is_none() {
                        self.defer(start);
                    } else {
                        self.record(start, Vec::new(), None, Durability::Buffered)
                            .await?;
                    }
                    (iteration, 1)
                };
            if attempt == 0 {
                attempt = 1;
                self.record(
                    vec![EpisodeEvent::AttemptStarted {
                        step: id.clone(),
                        iteration,
                        attempt,
                    }],
                    Vec::new(),
                    None,
                    Durability::Buffered,
                )
                .await?;
            }
            loop {
                let spine = owner.is_none();
                let result = match self
                    .clone()
                    .attempt(&def, iteration, attempt, spine, &scope)
                    .await
                {
                    Ok(r) => r,
                    Err(AttemptStop::Halt(h)) => return Err(h),
                    Err(AttemptStop::Stopped(stop)) => {
                        return self.stopped(&id, iteration, stop).await;
                    }
                };
                let finished = self
                    .snapshot()
                    .await
                    .steps
                    .get(&id)
                    .filter(|s| s.iteration == iteration && s.attempt == attempt)
                    .and_then(|s| s.current.finished.clone());
                // The attempt's end is committed with what follows it (the
                // step's end, or — before a retry's backoff — on its own):
                // one store commit fewer per step. A crash before that commit
                // re-derives the attempt's result from its recorded calls.
                let attempt_end = finished.is_none().then(|| EpisodeEvent::AttemptFinished {
                    step: id.clone(),
                    iteration,
                    attempt,
                    failure: result.as_ref().err().cloned(),
                });
                match result {
                    Ok(output) => {
                        let receipt = self.receipt(&id, Some(&output)).await?;
                        let mut events: Vec<EpisodeEvent> = attempt_end.into_iter().collect();
                        events.push(EpisodeEvent::StepFinished {
                            step: id.clone(),
                            iteration,
                            status: StepStatus::Completed,
                            output: Some(output.clone()),
                            failure: None,
                            receipt: Some(receipt),
                        });
                        // Writes of parallel branches are applied by the join,
                        // in branch order, so completion order cannot matter.
                        let parallel_owned = owner.as_ref().is_some_and(|o| {
                            matches!(
                                self.armed.step(o).map(|s| &s.kind),
                                Some(StepKind::Parallel(_))
                            )
                        });
                        if !parallel_owned && let Some(ev) = self.state_write(&def, &output).await {
                            events.push(ev);
                        }
                        self.record(events, Vec::new(), None, Durability::Buffered)
                            .await?;
                        return Ok(StepEnd::Completed(output));
                    }
                    Err(failure) => {
                        let retryable = failure
                            .class
                            .retry_class()
                            .is_some_and(|c| def.retry.on.contains(&c));
                        if retryable && attempt < def.retry.max_attempts {
                            if let Some(end) = attempt_end {
                                self.record(vec![end], Vec::new(), None, Durability::Buffered)
                                    .await?;
                            }
                            let delay = def.retry.delay_before(attempt + 1);
                            if delay.0 > 0
                                && scope
                                    .guard(self.exec.clock.sleep(delay.as_duration()))
                                    .await
                                    .is_err()
                            {
                                let stop = scope.stopped().unwrap_or(Stop::RunCancelled);
                                return self.stopped(&id, iteration, stop).await;
                            }
                            attempt += 1;
                            self.record(
                                vec![EpisodeEvent::AttemptStarted {
                                    step: id.clone(),
                                    iteration,
                                    attempt,
                                }],
                                Vec::new(),
                                None,
                                Durability::Buffered,
                            )
                            .await?;
                            continue;
                        }
                        let receipt = self.receipt(&id, None).await?;
                        let mut events: Vec<EpisodeEvent> = attempt_end.into_iter().collect();
                        events.push(EpisodeEvent::StepFinished {
                            step: id.clone(),
                            iteration,
                            status: StepStatus::Failed,
                            output: None,
                            failure: Some(failure.clone()),
                            receipt: Some(receipt),
                        });
                        self.record(events, Vec::new(), None, Durability::Buffered)
                            .await?;
                        return Ok(StepEnd::Failed(failure));
                    }
                }
            }
        }
        .boxed()
    }

    /// The receipt of step `id`'s current execution, from its recorded
    /// and queued events; `finished_at` is now.
    async fn receipt(&self, id: &StepId, output: Option<&Value>) -> Result<Receipt, Halt> {
        let snap = self.preview().await?;
        let st = snap.steps.get(id);
        let kind = self
            .armed
            .step(id)
            .map_or("step", |d| d.kind.name())
            .to_owned();
        Ok(Receipt {
            attempt: st.map_or(0, |s| s.attempt),
            action: st.and_then(|s| s.current.action.clone()).unwrap_or(kind),
            input_hash: st.and_then(|s| s.current.input_hash.clone()),
            output_hash: output.map(hash_json),
            started_at: st.map_or(0, |s| s.started_at),
            finished_at: self.exec.clock.now_ms(),
        })
    }

    /// Records that a step stopped because its scope did.
    async fn stopped(&self, id: &StepId, iteration: u32, stop: Stop) -> Result<StepEnd, Halt> {
        let status = match stop {
            Stop::Lost => StepStatus::Lost,
            Stop::RunCancelled => StepStatus::Cancelled,
        };
        let receipt = self.receipt(id, None).await?;
        self.record(
            vec![EpisodeEvent::StepFinished {
                step: id.clone(),
                iteration,
                status,
                output: None,
                failure: None,
                receipt: Some(receipt),
            }],
            Vec::new(),
            None,
            Durability::Buffered,
        )
        .await?;
        match stop {
            Stop::Lost => Ok(StepEnd::Lost),
            Stop::RunCancelled => Err(Halt::Cancelled),
        }
    }

    /// The state write a completed step makes, if it declares one.
    async fn state_write(&self, def: &StepDef, output: &Value) -> Option<EpisodeEvent> {
        let key = def.writes.as_ref()?;
        let reducer = self
            .armed
            .def
            .state
            .get(key)
            .and_then(|d| d.reducer)
            .unwrap_or_default();
        let snap = self.state.lock().await;
        let current = snap
            .state
            .get(key.as_str())
            .cloned()
            .unwrap_or_else(|| RunState::initial_value(reducer));
        let value = reduce(reducer, &current, output);
        Some(EpisodeEvent::StateWritten {
            key: key.0.clone(),
            reducer,
            value_hash: hash_json(&value),
            value,
        })
    }

    /// One attempt: the kind's work, then the verifiers.
    /// `spine`: the step is on the run's serial spine (not a fan-out branch).
    async fn attempt(
        self: Arc<Self>,
        def: &StepDef,
        iteration: u32,
        attempt: u32,
        spine: bool,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let snap = self.snapshot().await;
        let st = snap.steps.get(&def.id).cloned().unwrap_or_default();
        // Only this very attempt's records count: a deferred step start
        // leaves the previous execution's records in the state.
        let this_attempt = st.iteration == iteration && st.attempt == attempt;
        if let Some(finished) = st.current.finished.as_ref().filter(|_| this_attempt) {
            // The attempt ended before a crash; only the step's end is missing.
            return Ok(match finished {
                Some(f) => Err(f.clone()),
                None => Ok(st
                    .output
                    .clone()
                    .or_else(|| recorded_output(&st))
                    .unwrap_or(Value::Null)),
            });
        }
        let (input, result) = match &def.kind {
            StepKind::Tool(t) => {
                self.clone()
                    .tool_attempt(
                        def,
                        &t.tool,
                        &t.args.0,
                        (iteration, attempt),
                        // With no verifiers, the step's end follows the call
                        // at once: the call's outcome can ride with it.
                        spine && def.verify.is_empty(),
                        scope,
                    )
                    .await?
            }
            StepKind::Model(m) => {
                self.model_attempt(def, m, iteration, attempt, scope)
                    .await?
            }
            StepKind::Conditional(c) => (
                Value::Null,
                self.clone()
                    .conditional_attempt(def, c, iteration, scope)
                    .await?,
            ),
            StepKind::Parallel(p) => (
                Value::Null,
                self.clone()
                    .parallel_attempt(def, &p.branches, p.join, iteration, scope)
                    .await?,
            ),
            StepKind::SubWorkflow(s) => (
                Value::Null,
                self.clone()
                    .subworkflow_attempt(def, s, iteration, scope)
                    .await?,
            ),
            StepKind::Judgment(j) => (Value::Null, self.judgment_attempt(def, j, iteration).await?),
        };
        match result {
            Ok(output) if !def.verify.is_empty() => {
                self.verify(def, iteration, attempt, input, output, scope)
                    .await
            }
            other => Ok(other),
        }
    }

    async fn verify(
        &self,
        def: &StepDef,
        iteration: u32,
        attempt: u32,
        input: Value,
        output: Value,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let snap = self.snapshot().await;
        let recorded = snap
            .steps
            .get(&def.id)
            .filter(|s| s.iteration == iteration && s.attempt == attempt)
            .and_then(|s| s.current.verdicts.clone());
        let verdicts = match recorded {
            Some(v) => v,
            None => {
                let mut calls = Vec::new();
                for v in &def.verify {
                    let Some(identity) = snap.verifiers.get(&v.verifier.to_string()).cloned()
                    else {
                        return Err(AttemptStop::Halt(Halt::Internal(format!(
                            "verifier `{}` of step `{}` was not pinned at the run's start",
                            v.verifier, def.id
                        ))));
                    };
                    let call = VerifierCall {
                        verifier: identity.clone(),
                        input: input.clone(),
                        output: output.clone(),
                        config: v.config.clone(),
                        timeout: def.effective_timeout().as_duration(),
                    };
                    let tools = self.exec.tools.clone();
                    let config = v.config.clone();
                    calls.push(async move {
                        let r = tools.verify(call).await;
                        VerdictRecord {
                            verifier: identity,
                            config,
                            outcome: match r.outcome {
                                Ok(v) => VerdictOutcome::Verdict(v),
                                Err(failure) => VerdictOutcome::Err { failure },
                            },
                            record: r.record,
                        }
                    });
                }
                let verdicts = scope
                    .guard(futures::future::join_all(calls))
                    .await
                    .map_err(AttemptStop::Stopped)?;
                self.record(
                    vec![EpisodeEvent::Verified {
                        step: def.id.clone(),
                        iteration,
                        attempt,
                        verdicts: verdicts.clone(),
                    }],
                    Vec::new(),
                    None,
                    Durability::Buffered,
                )
                .await
                .map_err(AttemptStop::Halt)?;
                verdicts
            }
        };
        let rejections: Vec<String> = verdicts
            .iter()
            .filter(|v| !v.passed())
            .map(|v| match &v.outcome {
                VerdictOutcome::Verdict(x) => {
                    format!("`{}` rejected it: {}", v.verifier.name, x.reason)
                }
                VerdictOutcome::Err { failure } => {
                    format!("`{}` could not judge it: {failure}", v.verifier.name)
                }
            })
            .collect();
        if rejections.is_empty() {
            Ok(Ok(output))
        } else {
            Ok(Err(Failure::new(
                FailureClass::Verifier,
                rejections.join("; "),
            )))
        }
    }

    // ----- tool: the write-ahead intent wrapper -------------------------

    async fn tool_attempt(
        self: Arc<Self>,
        def: &StepDef,
        tool: &ToolRef,
        args: &Value,
        (iteration, attempt): (u32, u32),
        defer_outcome: bool,
        scope: &RunScope,
    ) -> Result<(Value, Result<Value, Failure>), AttemptStop> {
        let snap = self.snapshot().await;
        let args = match render_args(args, &context(&snap)) {
            Ok(a) => a,
            Err(e) => return Ok((Value::Null, Err(render_failure(e)))),
        };
        let result = self
            .call_tool(
                def,
                tool,
                args.clone(),
                (iteration, attempt),
                defer_outcome,
                scope,
            )
            .await?;
        Ok((args, result))
    }

    /// Calls a tool through the intent protocol: `Pending` (buffered),
    /// `Dispatched` (durable before the guest is called), the call, then
    /// `Committed` or `Failed` with the `ToolCalled` event (durable before the
    /// run moves on). On resume, the recorded phases decide: a committed call
    /// is replayed, a dispatched one is re-dispatched with the same
    /// idempotency key when the tool is pure or idempotent, and blocks the run
    /// as `outcome_unknown` otherwise.
    ///
    /// With `defer_outcome` the outcome is queued for the step's end commit
    /// (fsynced), which follows at once (see [`Deferred`]).
    async fn call_tool(
        &self,
        def: &StepDef,
        tool: &ToolRef,
        args: Value,
        (iteration, attempt): (u32, u32),
        defer_outcome: bool,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let halt = AttemptStop::Halt;
        let snap = self.snapshot().await;
        // A call already recorded for this very attempt (on resume). The
        // guard matters: a step's start may still be deferred, and then the
        // state still shows the previous execution's call.
        if let Some(recorded) = snap
            .steps
            .get(&def.id)
            .filter(|s| s.iteration == iteration && s.attempt == attempt)
            .and_then(|s| s.current.tool.clone())
        {
            return Ok(recorded.into_result());
        }
        let Some(pinned) = snap.tools.get(&tool.to_string()).cloned() else {
            return Err(halt(Halt::Internal(format!(
                "tool `{tool}` of step `{}` was not pinned at the run's start",
                def.id
            ))));
        };
        let key = idempotency_key(self.run.as_str(), def.id.as_str(), iteration);
        let args_hash = hash_json(&args);
        let intent = |phase: IntentPhase,
                      output_hash: Option<String>,
                      error: Option<String>,
                      record: Option<Value>| IntentRecord {
            run: self.run.clone(),
            step: def.id.clone(),
            iteration,
            attempt,
            phase,
            tool: pinned.identity.name.clone(),
            tool_version: pinned.identity.version.clone(),
            digest: pinned.identity.digest.clone(),
            effect: pinned.effect,
            args_hash: args_hash.clone(),
            idempotency_key: key.clone(),
            output_hash,
            error,
            record,
            at: self.exec.clock.now_ms(),
        };
        let phases = self.phases(&def.id, iteration, attempt);
        match phases.last() {
            Some(IntentPhase::Dispatched) => {
                if pinned.effect == EffectClass::NonIdempotent {
                    let reason = format!(
                        "outcome_unknown: step `{}` dispatched non-idempotent tool `{}` (idempotency key {key}) and no outcome was recorded; it is never replayed automatically — run `poimen reconcile {} {} --committed OUTPUT` or `--failed REASON`",
                        def.id, pinned.identity.name, self.run, def.id
                    );
                    self.record(
                        vec![EpisodeEvent::RunBlocked {
                            step: def.id.clone(),
                            iteration,
                            attempt,
                            reason: reason.clone(),
                        }],
                        Vec::new(),
                        Some((RunStatus::Blocked, Some(reason), None)),
                        Durability::Sync,
                    )
                    .await
                    .map_err(halt)?;
                    return Err(halt(Halt::Blocked));
                }
                // Pure or idempotent: dispatch again under the same key.
                self.record(
                    Vec::new(),
                    vec![intent(IntentPhase::Dispatched, None, None, None)],
                    None,
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
            }
            Some(IntentPhase::Pending) => {
                crash_point("after_pending");
                self.record(
                    Vec::new(),
                    vec![intent(IntentPhase::Dispatched, None, None, None)],
                    None,
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
                crash_point("after_dispatched");
            }
            Some(IntentPhase::Committed | IntentPhase::Failed) => {
                return Err(halt(Halt::Internal(format!(
                    "step `{}` attempt {attempt} has a final intent but no recorded tool call",
                    def.id
                ))));
            }
            None => {
                if let Some(max) = self.armed.def.budget.tool_calls
                    && snap.spent.tool_calls >= max
                {
                    return Err(halt(Halt::Fail {
                        reason: format!(
                            "budget exceeded: the run may make {max} tool calls and step `{}` would make one more",
                            def.id
                        ),
                        step: Some(def.id.clone()),
                    }));
                }
                crash_point("before_pending");
                self.record(
                    Vec::new(),
                    vec![intent(IntentPhase::Pending, None, None, None)],
                    None,
                    Durability::Buffered,
                )
                .await
                .map_err(halt)?;
                crash_point("after_pending");
                self.record(
                    Vec::new(),
                    vec![intent(IntentPhase::Dispatched, None, None, None)],
                    None,
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
                crash_point("after_dispatched");
            }
        }
        let call = ToolCall {
            tool: pinned.identity.clone(),
            args: args.clone(),
            idempotency_key: key.clone(),
            timeout: def.effective_timeout().as_duration(),
        };
        let result = match scope.guard(self.exec.tools.invoke(call)).await {
            Ok(r) => r,
            Err(stop) => {
                // The guest was interrupted: close the intent so nothing dangles.
                let failure = Failure::new(
                    FailureClass::Cancelled,
                    match stop {
                        Stop::Lost => "the branch lost its join while the call was in flight",
                        Stop::RunCancelled => "the run was cancelled while the call was in flight",
                    },
                );
                self.record(
                    vec![EpisodeEvent::ToolCalled {
                        step: def.id.clone(),
                        iteration,
                        attempt,
                        tool: pinned.identity.clone(),
                        effect: pinned.effect,
                        args: args.clone(),
                        args_hash: args_hash.clone(),
                        idempotency_key: key.clone(),
                        capabilities: Vec::new(),
                        record: Value::Null,
                        outcome: CallOutcome::Err {
                            failure: failure.clone(),
                        },
                        reconciled: false,
                    }],
                    vec![intent(
                        IntentPhase::Failed,
                        None,
                        Some(failure.to_string()),
                        None,
                    )],
                    None,
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
                return Err(AttemptStop::Stopped(stop));
            }
        };
        crash_point("before_committed");
        let (outcome, phase, output_hash, error) = match result.outcome {
            Ok(output) => {
                let h = hash_json(&output);
                (
                    CallOutcome::Ok {
                        output,
                        output_hash: h.clone(),
                    },
                    IntentPhase::Committed,
                    Some(h),
                    None,
                )
            }
            Err(failure) => {
                let e = failure.to_string();
                (
                    CallOutcome::Err { failure },
                    IntentPhase::Failed,
                    None,
                    Some(e),
                )
            }
        };
        let called = vec![EpisodeEvent::ToolCalled {
            step: def.id.clone(),
            iteration,
            attempt,
            tool: pinned.identity.clone(),
            effect: pinned.effect,
            args,
            args_hash: args_hash.clone(),
            idempotency_key: key.clone(),
            capabilities: result.capabilities,
            record: result.record.clone(),
            outcome: outcome.clone(),
            reconciled: false,
        }];
        let closed = vec![intent(phase, output_hash, error, Some(result.record))];
        if defer_outcome {
            self.defer_outcome(called, closed, "after_committed");
        } else {
            self.record(called, closed, None, Durability::Sync)
                .await
                .map_err(halt)?;
            crash_point("after_committed");
        }
        Ok(outcome.into_result())
    }

    // ----- model --------------------------------------------------------

    async fn model_attempt(
        &self,
        def: &StepDef,
        m: &workflow::ModelStep,
        iteration: u32,
        attempt: u32,
        scope: &RunScope,
    ) -> Result<(Value, Result<Value, Failure>), AttemptStop> {
        let halt = AttemptStop::Halt;
        let snap = self.snapshot().await;
        let ctx = context(&snap);
        let (prompt, mut partition) = match render_text(&m.prompt.0, &ctx) {
            Ok(p) => p,
            Err(e) => return Ok((Value::Null, Err(render_failure(e)))),
        };
        let system = match &m.system {
            Some(s) => match render_text(&s.0, &ctx) {
                Ok((text, p)) => {
                    partition.extend(p);
                    Some(text)
                }
                Err(e) => return Ok((Value::Null, Err(render_failure(e)))),
            },
            None => None,
        };
        partition.sort();
        partition.dedup();
        let input = Value::String(prompt.clone());
        let recorded = snap
            .steps
            .get(&def.id)
            .and_then(|s| s.current.model.clone());
        let text = match recorded {
            Some(Ok(text)) => text,
            Some(Err(failure)) => return Ok((input, Err(failure))),
            None => {
                let provider = self.exec.models.clone();
                let request = ModelRequest {
                    system: system.clone(),
                    prompt: prompt.clone(),
                    model: m.model.clone(),
                    effort: m.effort,
                    json: m.format == OutputFormat::Json,
                    max_tokens: self.armed.def.limits.tokens,
                    timeout: def.effective_timeout().as_duration(),
                };
                let started = self.exec.clock.now_ms();
                let timeout = request.timeout;
                let answer = scope
                    .guard(tokio::time::timeout(timeout, provider.complete(request)))
                    .await
                    .map_err(AttemptStop::Stopped)?;
                let latency_ms =
                    u64::try_from(self.exec.clock.now_ms().saturating_sub(started)).unwrap_or(0);
                let answer = answer.unwrap_or_else(|_| {
                    Err(Failure::new(
                        FailureClass::Timeout,
                        format!(
                            "model `{}` did not answer within {} ms",
                            provider.provider(),
                            timeout.as_millis()
                        ),
                    ))
                });
                match answer {
                    Ok(resp) => {
                        // Prompt and output are content-addressed blobs, written
                        // in the same commit as the event that names them.
                        let mut blobs =
                            vec![prompt.clone().into_bytes(), resp.text.clone().into_bytes()];
                        let prompt_blob = BlobHash::of(prompt.as_bytes());
                        let output_blob = BlobHash::of(resp.text.as_bytes());
                        let system_blob = system.as_ref().map(|s| {
                            blobs.push(s.clone().into_bytes());
                            BlobHash::of(s.as_bytes()).to_string()
                        });
                        self.commit(Batch {
                            events: vec![EpisodeEvent::ModelCalled {
                                step: def.id.clone(),
                                iteration,
                                attempt,
                                provider: provider.provider().to_owned(),
                                model: resp.model.clone(),
                                prompt: prompt_blob.to_string(),
                                system: system_blob,
                                partition,
                                output: output_blob.to_string(),
                                text: resp.text.clone(),
                                usage: resp.usage,
                                latency_ms,
                            }],
                            blobs,
                            durability: Durability::Buffered,
                            ..Batch::default()
                        })
                        .await
                        .map_err(halt)?;
                        resp.text
                    }
                    Err(failure) => {
                        self.record(
                            vec![EpisodeEvent::ModelFailed {
                                step: def.id.clone(),
                                iteration,
                                attempt,
                                provider: provider.provider().to_owned(),
                                failure: failure.clone(),
                            }],
                            Vec::new(),
                            None,
                            Durability::Buffered,
                        )
                        .await
                        .map_err(halt)?;
                        return Ok((input, Err(failure)));
                    }
                }
            }
        };
        let output = match m.format {
            OutputFormat::Text => Value::String(text),
            OutputFormat::Json => match serde_json::from_str::<Value>(strip_fences(&text)) {
                Ok(v) => v,
                Err(e) => {
                    return Ok((
                        input,
                        Err(Failure::new(
                            FailureClass::Failed,
                            format!(
                                "the model's answer is not the JSON the step asks for ({e}): {}",
                                preview(&text)
                            ),
                        )),
                    ));
                }
            },
        };
        Ok((input, Ok(output)))
    }

    // ----- conditional --------------------------------------------------

    async fn conditional_attempt(
        self: Arc<Self>,
        def: &StepDef,
        c: &workflow::ConditionalStep,
        iteration: u32,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let snap = self.snapshot().await;
        let chosen = match snap.steps.get(&def.id).and_then(|s| s.condition.clone()) {
            Some(chosen) => chosen,
            None => {
                let result = match eval_predicate(&c.on.0, &context(&snap)) {
                    Ok(b) => b,
                    Err(e) => return Ok(Err(render_failure(e))),
                };
                let (chosen, other) = if result {
                    (Some(c.then.clone()), c.otherwise.clone())
                } else {
                    (c.otherwise.clone(), Some(c.then.clone()))
                };
                let mut events = vec![EpisodeEvent::ConditionEvaluated {
                    step: def.id.clone(),
                    iteration,
                    result,
                    chosen: chosen.clone(),
                }];
                if let Some(other) = other {
                    let other_iteration = snap.steps.get(&other).map_or(0, |s| s.iteration);
                    events.push(EpisodeEvent::StepFinished {
                        step: other,
                        iteration: other_iteration,
                        status: StepStatus::Skipped,
                        output: None,
                        failure: None,
                        receipt: None,
                    });
                }
                self.record(events, Vec::new(), None, Durability::Buffered)
                    .await
                    .map_err(AttemptStop::Halt)?;
                chosen
            }
        };
        let Some(target) = chosen else {
            return Ok(Ok(Value::Null));
        };
        match self
            .clone()
            .exec_step(target.clone(), Some(def.id.clone()), scope.clone())
            .await
        {
            Ok(StepEnd::Completed(v)) => Ok(Ok(v)),
            Ok(StepEnd::Failed(f)) => Ok(Err(Failure::new(
                f.class,
                format!("`{target}`: {}", f.message),
            ))),
            Ok(StepEnd::Lost) => Err(AttemptStop::Stopped(Stop::Lost)),
            Err(h) => Err(AttemptStop::Halt(h)),
        }
    }

    // ----- parallel -----------------------------------------------------

    async fn parallel_attempt(
        self: Arc<Self>,
        def: &StepDef,
        branches: &[StepId],
        join: JoinPolicy,
        iteration: u32,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let snap = self.snapshot().await;
        let me = snap.steps.get(&def.id).cloned().unwrap_or_default();
        if let Some(j) = &me.joined {
            return Ok(self.join_result(def, j, &snap));
        }
        if !me.forked {
            self.record(
                vec![EpisodeEvent::BranchesForked {
                    step: def.id.clone(),
                    iteration,
                    branches: branches.to_vec(),
                    join,
                }],
                Vec::new(),
                None,
                Durability::Buffered,
            )
            .await
            .map_err(AttemptStop::Halt)?;
        }
        let needed = match join {
            JoinPolicy::All => branches.len(),
            JoinPolicy::Any => 1,
            JoinPolicy::Quorum(n) => n as usize,
        };
        // Branches already finished in this execution, in finish order.
        let snap = self.snapshot().await;
        let finished: Vec<StepId> = snap
            .steps
            .get(&def.id)
            .map(|s| s.finish_order.clone())
            .unwrap_or_default();
        let mut winners: Vec<StepId> = Vec::new();
        let mut failed: Vec<StepId> = Vec::new();
        for b in &finished {
            match snap.steps.get(b).map(|s| s.status) {
                Some(StepStatus::Completed) if winners.len() < needed => winners.push(b.clone()),
                Some(StepStatus::Completed | StepStatus::Lost | StepStatus::Cancelled) => {}
                _ => failed.push(b.clone()),
            }
        }
        let mut set = tokio::task::JoinSet::new();
        let mut scopes = BTreeMap::new();
        if winners.len() < needed && branches.len() - failed.len() >= needed {
            for b in branches.iter().filter(|b| !finished.contains(b)) {
                let branch_scope = scope.branch();
                scopes.insert(b.clone(), branch_scope.clone());
                let ctx = self.clone();
                let (b, owner) = (b.clone(), def.id.clone());
                set.spawn(async move {
                    let r = ctx.exec_step(b.clone(), Some(owner), branch_scope).await;
                    (b, r)
                });
            }
        }
        let mut halt: Option<Halt> = None;
        while let Some(joined) = set.join_next().await {
            let (b, r) = match joined {
                Ok(x) => x,
                Err(e) => {
                    halt.get_or_insert(Halt::Internal(format!(
                        "a branch task of `{}` died: {e}",
                        def.id
                    )));
                    continue;
                }
            };
            match r {
                Ok(StepEnd::Completed(_)) => {
                    if winners.len() < needed {
                        winners.push(b);
                    }
                }
                Ok(StepEnd::Failed(_)) => failed.push(b),
                Ok(StepEnd::Lost) => {}
                Err(h) => {
                    // Cancellation wins over waiting; the first other halt is kept.
                    match (&halt, &h) {
                        (None, _) | (Some(Halt::Waiting | Halt::Blocked), Halt::Cancelled) => {
                            halt = Some(h)
                        }
                        _ => {}
                    }
                }
            }
            let decided = winners.len() >= needed || branches.len() - failed.len() < needed;
            if decided {
                // The join is decided: the rest lose the race.
                for (id, s) in &scopes {
                    if !winners.contains(id) {
                        s.cancel();
                    }
                }
            }
        }
        if let Some(h) = halt {
            let decided = winners.len() >= needed;
            if !decided
                || matches!(
                    h,
                    Halt::Cancelled | Halt::Store(_) | Halt::Internal(_) | Halt::Fail { .. }
                )
            {
                return Err(AttemptStop::Halt(h));
            }
        }
        if scope.stopped().is_some() {
            return Err(AttemptStop::Stopped(
                scope.stopped().unwrap_or(Stop::RunCancelled),
            ));
        }
        // Record the join, winners in branch declaration order.
        let snap = self.snapshot().await;
        let winners: Vec<StepId> = branches
            .iter()
            .filter(|b| winners.contains(b))
            .cloned()
            .collect();
        let failed: Vec<StepId> = branches
            .iter()
            .filter(|b| failed.contains(b))
            .cloned()
            .collect();
        let losers: Vec<StepId> = branches
            .iter()
            .filter(|b| !winners.contains(b) && !failed.contains(b))
            .cloned()
            .collect();
        let mut events = vec![EpisodeEvent::BranchesJoined {
            step: def.id.clone(),
            iteration,
            winners: winners.clone(),
            losers: losers.clone(),
            failed: failed.clone(),
        }];
        if winners.len() >= needed {
            // Winners' state writes, applied in branch order.
            let mut state = snap.state.clone();
            for w in &winners {
                let (Some(bdef), Some(out)) = (
                    self.armed.step(w),
                    snap.steps.get(w).and_then(|s| s.output.clone()),
                ) else {
                    continue;
                };
                if let Some(key) = &bdef.writes {
                    let reducer = self
                        .armed
                        .def
                        .state
                        .get(key)
                        .and_then(|d| d.reducer)
                        .unwrap_or_default();
                    let current = state
                        .get(key.as_str())
                        .cloned()
                        .unwrap_or_else(|| RunState::initial_value(reducer));
                    let value = reduce(reducer, &current, &out);
                    state.insert(key.0.clone(), value.clone());
                    events.push(EpisodeEvent::StateWritten {
                        key: key.0.clone(),
                        reducer,
                        value_hash: hash_json(&value),
                        value,
                    });
                }
            }
        }
        self.record(events, Vec::new(), None, Durability::Buffered)
            .await
            .map_err(AttemptStop::Halt)?;
        let snap = self.snapshot().await;
        let joined = snap.steps.get(&def.id).and_then(|s| s.joined.clone());
        match joined {
            Some(j) => Ok(self.join_result(def, &j, &snap)),
            None => Err(AttemptStop::Halt(Halt::Internal(
                "the join was not recorded".into(),
            ))),
        }
    }

    fn join_result(
        &self,
        def: &StepDef,
        j: &crate::state::Join,
        snap: &RunState,
    ) -> Result<Value, Failure> {
        let needed = match &def.kind {
            StepKind::Parallel(p) => match p.join {
                JoinPolicy::All => p.branches.len(),
                JoinPolicy::Any => 1,
                JoinPolicy::Quorum(n) => n as usize,
            },
            _ => 0,
        };
        if j.winners.len() < needed {
            let why: Vec<String> = j
                .failed
                .iter()
                .map(|b| {
                    let f = snap.steps.get(b).and_then(|s| s.failure.clone());
                    match f {
                        Some(f) => format!("`{b}`: {f}"),
                        None => format!("`{b}` failed"),
                    }
                })
                .collect();
            return Err(Failure::new(
                FailureClass::Failed,
                format!(
                    "{} of {needed} needed branches succeeded; {}",
                    j.winners.len(),
                    why.join("; ")
                ),
            ));
        }
        let out: serde_json::Map<String, Value> = j
            .winners
            .iter()
            .map(|w| {
                (
                    w.0.clone(),
                    snap.steps
                        .get(w)
                        .and_then(|s| s.output.clone())
                        .unwrap_or(Value::Null),
                )
            })
            .collect();
        Ok(Value::Object(out))
    }

    // ----- sub-workflow -------------------------------------------------

    async fn subworkflow_attempt(
        self: Arc<Self>,
        def: &StepDef,
        s: &workflow::SubWorkflowStep,
        iteration: u32,
        scope: &RunScope,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let halt = AttemptStop::Halt;
        let snap = self.snapshot().await;
        let link = snap.steps.get(&def.id).and_then(|st| st.child.clone());
        let (child_run, version) = match link {
            Some(l) => {
                if let Some((status, output)) = &l.finished {
                    return Ok(child_result(&l.run, *status, output.clone()));
                }
                (
                    RunId::parse(&l.run).map_err(|e| halt(Halt::Internal(e.to_string())))?,
                    l.version,
                )
            }
            None => {
                let Some(version) =
                    self.armed
                        .subworkflows
                        .get(&def.id)
                        .copied()
                        .or(match &s.version {
                            workflow::VersionSelector::Pinned(v) => Some(*v),
                            workflow::VersionSelector::Latest => None,
                        })
                else {
                    return Err(halt(Halt::Internal(format!(
                        "sub-workflow `{}` of step `{}` was not resolved when the workflow was armed",
                        s.id, def.id
                    ))));
                };
                let input = match render_args(&s.input.0, &context(&snap)) {
                    Ok(i) => i,
                    Err(e) => return Ok(Err(render_failure(e))),
                };
                let parent = ParentLink {
                    run: self.run.to_string(),
                    step: def.id.clone(),
                    iteration,
                };
                let child = match self.exec.create_child(&self, version, input, parent).await {
                    Ok(c) => c,
                    Err(failure) => return Ok(Err(failure)),
                };
                self.record(
                    vec![EpisodeEvent::ChildRunLinked {
                        step: def.id.clone(),
                        iteration,
                        child_run: child.to_string(),
                        child_version: version,
                    }],
                    Vec::new(),
                    None,
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
                (child, version)
            }
        };
        let outcome = match self
            .exec
            .drive_child(
                &self,
                &child_run,
                version,
                scope.child_run(child_run.to_string()),
            )
            .await
        {
            Ok(o) => o,
            Err(failure) => return Ok(Err(failure)),
        };
        match outcome.status {
            RunStatus::Completed | RunStatus::Failed => {
                self.record(
                    vec![EpisodeEvent::ChildRunFinished {
                        step: def.id.clone(),
                        iteration,
                        child_run: child_run.to_string(),
                        status: outcome.status,
                        output: outcome.output.clone(),
                    }],
                    Vec::new(),
                    None,
                    Durability::Buffered,
                )
                .await
                .map_err(halt)?;
                let mut r = child_result(child_run.as_str(), outcome.status, outcome.output);
                if let (Err(f), Some(reason)) = (&mut r, outcome.reason) {
                    f.message = format!("{}: {reason}", f.message);
                }
                Ok(r)
            }
            RunStatus::WaitingJudgment => {
                self.mark_waiting(format!("child run {child_run} waits for a judgment"))
                    .await
                    .map_err(halt)?;
                Err(halt(Halt::Waiting))
            }
            RunStatus::Blocked => {
                let reason = format!(
                    "child run {child_run} is blocked: {}",
                    outcome.reason.unwrap_or_default()
                );
                self.record(
                    vec![EpisodeEvent::RunBlocked {
                        step: def.id.clone(),
                        iteration,
                        attempt: 0,
                        reason: reason.clone(),
                    }],
                    Vec::new(),
                    Some((RunStatus::Blocked, Some(reason), None)),
                    Durability::Sync,
                )
                .await
                .map_err(halt)?;
                Err(halt(Halt::Blocked))
            }
            RunStatus::Cancelled => Err(AttemptStop::Stopped(
                scope.stopped().unwrap_or(Stop::RunCancelled),
            )),
            RunStatus::Running | RunStatus::Queued => Err(halt(Halt::Internal(format!(
                "child run {child_run} stopped while still running: {}",
                outcome.reason.unwrap_or_default()
            )))),
        }
    }

    async fn mark_waiting(&self, reason: String) -> Result<(), Halt> {
        if self.snapshot().await.status == Some(RunStatus::WaitingJudgment) {
            return Ok(());
        }
        self.record(
            vec![EpisodeEvent::RunWaiting {
                reason: reason.clone(),
            }],
            Vec::new(),
            Some((RunStatus::WaitingJudgment, Some(reason), None)),
            Durability::Sync,
        )
        .await
    }

    // ----- judgment -----------------------------------------------------

    async fn judgment_attempt(
        &self,
        def: &StepDef,
        j: &workflow::JudgmentStep,
        iteration: u32,
    ) -> Result<Result<Value, Failure>, AttemptStop> {
        let halt = AttemptStop::Halt;
        let snap = self.snapshot().await;
        if let Some(state) = snap.steps.get(&def.id).and_then(|s| s.judgment.clone()) {
            return match state.result {
                Some(result) => Ok(Ok(result)),
                None => {
                    self.mark_waiting(format!(
                        "step `{}` waits for judgment {}",
                        def.id, state.request_id
                    ))
                    .await
                    .map_err(halt)?;
                    Err(halt(Halt::Waiting))
                }
            };
        }
        let ctx = context(&snap);
        let question = match render_text(&j.question.0, &ctx) {
            Ok((q, _)) => q,
            Err(e) => return Ok(Err(render_failure(e))),
        };
        let mut sources = Vec::new();
        for s in &j.sources {
            match render_text(&s.0, &ctx) {
                Ok((text, _)) => {
                    sources.push(json!({"hash": hash_bytes(text.as_bytes()), "text": text}))
                }
                Err(e) => return Ok(Err(render_failure(e))),
            }
        }
        let request = json!({
            "workflow": self.armed.def.id,
            "version": self.armed.version,
            "step": def.id,
            "iteration": iteration,
            "question": question,
            "sources": sources,
            "result_schema": j.result_schema,
            "executor": j.executor,
            "profile": j.profile,
            "constraints": j.constraints,
        });
        let request_hash = hash_json(&request);
        let request_id = judgment_id(self.run.as_str(), def.id.as_str(), iteration);
        crash_point("before_judgment");
        let reason = format!("step `{}` waits for judgment {request_id}", def.id);
        self.commit(Batch {
            events: vec![
                EpisodeEvent::JudgmentRequested {
                    step: def.id.clone(),
                    iteration,
                    request_id: request_id.to_string(),
                    request_hash: request_hash.clone(),
                    request: request.clone(),
                },
                EpisodeEvent::RunWaiting {
                    reason: reason.clone(),
                },
            ],
            judgments: vec![store::JudgmentWrite::Open {
                id: request_id,
                step: def.id.clone(),
                iteration,
                request,
                request_hash,
                at: self.exec.clock.now_ms(),
            }],
            update: Some((RunStatus::WaitingJudgment, Some(reason), None)),
            durability: Durability::Sync,
            ..Batch::default()
        })
        .await
        .map_err(halt)?;
        crash_point("waiting_judgment");
        Err(halt(Halt::Waiting))
    }
}

/// How an attempt stopped without a result.
pub(crate) enum AttemptStop {
    Halt(Halt),
    Stopped(Stop),
}

impl From<Halt> for AttemptStop {
    fn from(h: Halt) -> Self {
        AttemptStop::Halt(h)
    }
}

fn child_result(run: &str, status: RunStatus, output: Option<Value>) -> Result<Value, Failure> {
    match status {
        RunStatus::Completed => Ok(output.unwrap_or(Value::Null)),
        other => Err(Failure::new(
            FailureClass::Failed,
            format!("child run {run} ended {other:?}"),
        )),
    }
}

fn recorded_output(st: &crate::state::StepState) -> Option<Value> {
    match &st.current.tool {
        Some(CallOutcome::Ok { output, .. }) => Some(output.clone()),
        _ => None,
    }
}

/// The id of a judgment request: derived from (run, step, iteration), so a
/// resumed run re-finds its own request. (A ULID made of hash bits: it has
/// the id's shape without reading the clock.)
pub fn judgment_id(run: &str, step: &str, iteration: u32) -> store::JudgmentId {
    let key = idempotency_key(run, step, iteration);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&blake3::hash(key.as_bytes()).as_bytes()[..16]);
    store::JudgmentId::generate(ulid::Ulid::from_bytes(bytes))
}

fn render_failure(e: RenderError) -> Failure {
    Failure::new(FailureClass::InvalidInput, e.to_string())
}

/// Checks a value against a JSON Schema; the problems, joined, when it fails.
pub(crate) fn check_schema(schema: &Value, value: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the schema itself is invalid: {e}"))?;
    let problems: Vec<String> = validator
        .iter_errors(value)
        .map(|e| {
            let path = e.instance_path().to_string();
            if path.is_empty() {
                e.to_string()
            } else {
                format!("at {path}: {e}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn strip_fences(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn preview(text: &str) -> String {
    let mut s: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        s.push('…');
    }
    s
}

#[allow(dead_code)]
fn _assert_send(ctx: Arc<RunCtx>) {
    fn is_send<T: Send>(_: T) {}
    is_send(ctx.drive());
    let _ = WorkflowVersion::of_canonical_bytes(b"");
}
