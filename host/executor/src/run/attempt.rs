//! One step execution: its start, its attempts (strictly serial), the
//! verifiers of each attempt (fanned out and joined), retries with backoff,
//! its end with a receipt, and its state write.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use poimen_workflow::{StepDef, StepId, StepKind};
use serde_json::Value;
use tracing::Instrument;

use super::rubric::Scored;
use super::{Halt, Inconsistency, RunCtx, RunFailure, StepEnd};
use crate::effects::{Contract, Failure, FailureClass, VerifierCall};
use crate::episode::{
    CallOutcome, EpisodeEvent, Receipt, StepStatus, VerdictOutcome, VerdictRecord,
};
use crate::hash::hash_json;
use crate::render::{render_args, template_context};
use crate::scope::RunScope;
use crate::state::{RunState, reduce};

type StepFuture = BoxFuture<'static, Result<StepEnd, Halt>>;

/// Aborts a timer task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Which attempt of which execution of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttemptId {
    pub iteration: u32,
    pub attempt: u32,
}

/// What follows a tool call in its step: it decides whether the call's
/// outcome is queued for the step's end (one commit fewer) or committed on
/// its own, fsynced, before anything else happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCall {
    /// The step's end, at once: the outcome rides with it.
    End,
    /// Verifiers or a rubric, then the step's end: the outcome is fsynced
    /// first. Verifiers may take long, and a crash while they run must not
    /// cost the call — a re-dispatch under the same key, or, for a
    /// non-idempotent tool, a run blocked as `outcome_unknown`. Their
    /// verdicts ride with the step's end instead (`verify`): still two
    /// fsyncs.
    Verification,
}

impl RunCtx {
    /// Executes (or resumes) one step execution: its attempts, verifiers,
    /// retries, and its state write. Never returns [`StepEnd::Cancelled`]:
    /// a cancelled step records its end, then halts the run.
    pub fn exec_step(
        self: Arc<Self>,
        id: StepId,
        owner: Option<StepId>,
        scope: RunScope,
    ) -> StepFuture {
        let span = tracing::info_span!(
            "step",
            step = %id,
            kind = self.runnable.step(&id).map_or("", |d| d.kind.name()),
        );
        async move {
            // The definition is borrowed from the version, not copied.
            let runnable = Arc::clone(&self.runnable);
            let Some(def) = runnable.step(&id) else {
                return Err(Inconsistency::UnknownStep(id).into());
            };
            // What is read of the step (not a copy of it, which would hold
            // its last output).
            let (status, last_iteration, last_attempt, executions_spent) = {
                let snap = self.snapshot().await;
                let st = snap.steps.get(&id);
                (
                    st.map_or(StepStatus::default(), |s| s.status),
                    st.map_or(0, |s| s.iteration),
                    st.map_or(0, |s| s.attempt),
                    snap.spent.step_executions,
                )
            };
            let (iteration, mut attempt) =
                if matches!(status, StepStatus::Running | StepStatus::Waiting) {
                    (last_iteration, last_attempt)
                } else {
                    let iteration = last_iteration + 1;
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
                    let limit = self.runnable.def.limits.steps;
                    let reached = |(executed, limit): (u64, u32)| {
                        Halt::Fail(RunFailure::StepLimit {
                            step: id.clone(),
                            executed,
                            limit,
                        })
                    };
                    // A tool or model step's start is committed with its
                    // intent (`Pending`, `ModelRequested`): one store commit
                    // fewer per step — on the spine and in a fan-out branch
                    // alike, each in its own lane (see `Deferred`). The step
                    // limit counts the starts queued in every lane.
                    if matches!(def.kind, StepKind::Tool(_) | StepKind::Model(_)) {
                        self.defer_start(start, limit).await.map_err(reached)?;
                    } else {
                        let executed = executions_spent + self.queued_starts();
                        if let Some(max) = limit
                            && executed >= u64::from(max)
                        {
                            return Err(reached((executed, max)));
                        }
                        self.record(start).await?;
                    }
                    (iteration, 1)
                };
            if attempt == 0 {
                attempt = 1;
                self.record(vec![EpisodeEvent::AttemptStarted {
                    step: id.clone(),
                    iteration,
                    attempt,
                }])
                .await?;
            }
            loop {
                let at = AttemptId { iteration, attempt };
                let span = tracing::info_span!("attempt", iteration, attempt);
                let mut end = self
                    .clone()
                    .attempt(def, at, &scope)
                    .instrument(span)
                    .await?;
                // Writes of parallel branches are applied by the join, in
                // branch order, so completion order cannot matter.
                let parallel_owned = owner.as_ref().is_some_and(|o| {
                    matches!(
                        self.runnable.step(o).map(|s| &s.kind),
                        Some(StepKind::Parallel(_))
                    )
                });
                // The state write is checked against the key's contract
                // before the step counts as completed: a write that breaks
                // it fails the attempt (and may be retried).
                // The policy's output bound holds for every step's output.
                if let (StepEnd::Completed(output), Some(limit)) =
                    (&end, self.kernel.config.output_bytes)
                {
                    let size = crate::hash::canonical_json(output).len() as u64;
                    if size > limit {
                        end = StepEnd::Failed(Failure::new(
                            FailureClass::Failed,
                            format!(
                                "step `{id}` produced {size} bytes of output, over the policy's `[bounds] output-bytes` of {limit}"
                            ),
                        ));
                    }
                }
                let mut write = None;
                if let StepEnd::Completed(output) = &end
                    && !parallel_owned
                {
                    match self.state_write(def, output).await {
                        Ok(w) => write = w,
                        Err(failure) => end = StepEnd::Failed(failure),
                    }
                }
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
                let attempt_end = |failure: Option<Failure>| {
                    finished.is_none().then(|| EpisodeEvent::AttemptFinished {
                        step: id.clone(),
                        iteration,
                        attempt,
                        failure,
                    })
                };
                match end {
                    StepEnd::Completed(output) => {
                        let receipt = self.receipt(&id, Some(&output)).await?;
                        let mut events: Vec<EpisodeEvent> = attempt_end(None).into_iter().collect();
                        events.push(EpisodeEvent::StepFinished {
                            step: id.clone(),
                            iteration,
                            status: StepStatus::Completed,
                            output: Some(output.clone()),
                            failure: None,
                            receipt: Some(receipt),
                        });
                        events.extend(write);
                        self.record(events).await?;
                        return Ok(StepEnd::Completed(output));
                    }
                    StepEnd::Failed(failure) => {
                        let retryable = failure
                            .class
                            .retry_class()
                            .is_some_and(|c| def.retry.on.contains(&c));
                        if retryable && attempt < def.retry.max_attempts {
                            if let Some(end) = attempt_end(Some(failure.clone())) {
                                self.record(vec![end]).await?;
                            }
                            let delay = def.retry.delay_before(attempt + 1);
                            if delay.0 > 0
                                && let Err(stop) = scope
                                    .guard(self.kernel.clock.sleep(delay.as_duration()))
                                    .await
                            {
                                return self.stopped(&id, iteration, stop.into()).await;
                            }
                            attempt += 1;
                            self.record(vec![EpisodeEvent::AttemptStarted {
                                step: id.clone(),
                                iteration,
                                attempt,
                            }])
                            .await?;
                            continue;
                        }
                        let receipt = self.receipt(&id, None).await?;
                        let mut events: Vec<EpisodeEvent> =
                            attempt_end(Some(failure.clone())).into_iter().collect();
                        events.push(EpisodeEvent::StepFinished {
                            step: id.clone(),
                            iteration,
                            status: StepStatus::Failed,
                            output: None,
                            failure: Some(failure.clone()),
                            receipt: Some(receipt),
                        });
                        self.record(events).await?;
                        return Ok(StepEnd::Failed(failure));
                    }
                    StepEnd::Lost | StepEnd::Cancelled => {
                        return self.stopped(&id, iteration, end).await;
                    }
                }
            }
        }
        .instrument(span)
        .boxed()
    }

    /// The receipt of step `id`'s current execution, from its recorded
    /// and queued events; `finished_at` is now.
    async fn receipt(&self, id: &StepId, output: Option<&Value>) -> Result<Receipt, Halt> {
        let st = self.preview_step(id).await?;
        let st = st.as_ref();
        let kind = self
            .runnable
            .step(id)
            .map_or("step", |d| d.kind.name())
            .to_owned();
        Ok(Receipt {
            attempt: st.map_or(0, |s| s.attempt),
            action: st.and_then(|s| s.current.action.clone()).unwrap_or(kind),
            input_hash: st.and_then(|s| s.current.input_hash.clone()),
            // The tool's recorded hash when the step's output is the tool's
            // (a comparison, cheaper than hashing a large output again).
            output_hash: output.map(|out| match st.and_then(|s| s.current.tool.as_ref()) {
                Some(CallOutcome::Ok {
                    output: called,
                    output_hash,
                }) if **called == *out => output_hash.clone(),
                _ => hash_json(out),
            }),
            started_at: st.map_or(0, |s| s.started_at),
            finished_at: self.kernel.clock.now_ms(),
        })
    }

    /// Records that a step stopped because its scope did: a lost branch
    /// ends [`StepEnd::Lost`]; a cancelled step halts the run.
    async fn stopped(&self, id: &StepId, iteration: u32, end: StepEnd) -> Result<StepEnd, Halt> {
        let status = match end {
            StepEnd::Lost => StepStatus::Lost,
            _ => StepStatus::Cancelled,
        };
        let receipt = self.receipt(id, None).await?;
        self.record(vec![EpisodeEvent::StepFinished {
            step: id.clone(),
            iteration,
            status,
            output: None,
            failure: None,
            receipt: Some(receipt),
        }])
        .await?;
        match end {
            StepEnd::Lost => Ok(StepEnd::Lost),
            _ => Err(Halt::Cancelled),
        }
    }

    /// The state write a completed step makes, if it declares one — or
    /// the contract it would break.
    async fn state_write(
        &self,
        def: &StepDef,
        output: &Value,
    ) -> Result<Option<EpisodeEvent>, Failure> {
        let Some(key) = def.writes.as_ref() else {
            return Ok(None);
        };
        let snap = self.state.lock().await;
        let value = self.reduced(key.as_str(), snap.state.get(key.as_str()), output)?;
        Ok(Some(value))
    }

    /// The `state_written` event of a write to `key` whose current value is
    /// `current`: through the key's reducer, checked against its schema.
    pub(super) fn reduced(
        &self,
        key: &str,
        current: Option<&Value>,
        write: &Value,
    ) -> Result<EpisodeEvent, Failure> {
        let reducer = self
            .runnable
            .def
            .state
            .get(key)
            .and_then(|d| d.reducer)
            .unwrap_or_default();
        let initial = RunState::initial_value(reducer);
        let value = reduce(reducer, current.unwrap_or(&initial), write).map_err(|e| {
            Failure::contract(Contract::Reducer {
                key: key.to_owned(),
                reducer: e.reducer,
                value: e.value,
                write: e.write,
            })
        })?;
        if let Some(schema) = self.runnable.schemas.state.get(key) {
            schema.check(&value).map_err(|v| {
                Failure::contract(Contract::StateSchema {
                    key: key.to_owned(),
                    violations: v.0,
                })
            })?;
        }
        Ok(EpisodeEvent::StateWritten {
            key: key.to_owned(),
            reducer,
            value_hash: hash_json(&value),
            value,
        })
    }

    /// The workflow version a tool step's tool runs, when the run pinned a
    /// workflow registered as a tool for it.
    async fn workflow_tool(
        &self,
        t: &poimen_workflow::ToolStep,
    ) -> Option<poimen_workflow::WorkflowVersion> {
        self.snapshot()
            .await
            .tools
            .get(&t.tool.to_string())
            .and_then(|p| p.workflow)
    }

    /// A worker of this host's scheduler for one step execution, waited
    /// for by the run's priority unless the scope stops first.
    async fn worker(&self, scope: &RunScope) -> Result<crate::sched::Permit, crate::scope::Stop> {
        scope
            .guard(self.kernel.sched.acquire(self.runnable.def.priority))
            .await
    }

    /// One attempt: the kind's work, then the verifiers.
    async fn attempt(
        self: Arc<Self>,
        def: &StepDef,
        at: AttemptId,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        // Read where it lies: the step's records, not a copy of them.
        let (resumed, recorded_start) = {
            let snap = self.snapshot().await;
            let st = snap.steps.get(&def.id);
            // Only this very attempt's records count: a deferred step start
            // leaves the previous execution's records in the state.
            let this_attempt =
                st.filter(|s| s.iteration == at.iteration && s.attempt == at.attempt);
            // The attempt ended before a crash; only the step's end is missing.
            let resumed = this_attempt.and_then(|st| {
                st.current.finished.as_ref().map(|finished| match finished {
                    Some(f) => StepEnd::Failed(f.clone()),
                    None => StepEnd::Completed(
                        st.output
                            .clone()
                            .or_else(|| match &st.current.tool {
                                Some(CallOutcome::Ok { output, .. }) => Some(Value::clone(output)),
                                _ => None,
                            })
                            .unwrap_or(Value::Null),
                    ),
                })
            });
            let recorded_start = st
                .filter(|s| s.iteration == at.iteration && s.started_at > 0)
                .map(|s| s.started_at);
            (resumed, recorded_start)
        };
        if let Some(end) = resumed {
            return Ok(end);
        }
        // A step that contains others (a fan-out, a choice, a child run)
        // is bounded as a whole by its `timeout`, counted from the
        // execution's start (waits included): what is still running then is
        // stopped and recorded as such, and the step fails as timed out.
        let workflow_tool = match &def.kind {
            StepKind::Tool(t) => self.workflow_tool(t).await,
            _ => None,
        };
        // The execution's start: recorded, or — a start not yet committed
        // (a tool step's rides with its first write) — now.
        let started_at = recorded_start.unwrap_or_else(|| self.kernel.clock.now_ms());
        let bounded = match (&def.kind, def.timeout) {
            (
                StepKind::Parallel(_) | StepKind::Conditional(_) | StepKind::SubWorkflow(_),
                Some(t),
            ) => Some(started_at.saturating_add(i64::try_from(t.0).unwrap_or(i64::MAX))),
            (StepKind::Tool(_), Some(t)) if workflow_tool.is_some() => {
                Some(started_at.saturating_add(i64::try_from(t.0).unwrap_or(i64::MAX)))
            }
            _ => None,
        };
        let group = match bounded {
            Some(_) => scope.branch(),
            None => scope.clone(),
        };
        let timer = bounded.map(|deadline| {
            if deadline <= self.kernel.clock.now_ms() {
                group.cancel();
            }
            let (clock, g) = (self.kernel.clock.clone(), group.clone());
            AbortOnDrop(tokio::spawn(async move {
                clock.sleep_until(deadline).await;
                g.cancel();
            }))
        });
        let (input, end) = match &def.kind {
            StepKind::Tool(t) if let Some(version) = workflow_tool => {
                // A workflow called as a tool: a child run, bounded like a
                // sub-workflow by the step's timeout, which holds no worker
                // of its own (its steps take theirs).
                let args = render_args(&t.args.0, &template_context(&self.snapshot().await))
                    .unwrap_or(Value::Null);
                let end = self
                    .clone()
                    .workflow_tool_attempt(def, t, version, at, &group)
                    .await?;
                (args, end)
            }
            StepKind::Tool(t) => {
                // What follows the call decides whether its outcome may
                // ride with the step's end (`call_tool`).
                let after = if def.verify.is_empty() && def.rubric.criteria.is_empty() {
                    AfterCall::End
                } else {
                    AfterCall::Verification
                };
                let _worker = match self.worker(scope).await {
                    Ok(w) => w,
                    Err(stop) => return Ok(stop.into()),
                };
                self.clone().tool_attempt(def, t, at, after, scope).await?
            }
            StepKind::Model(m) => {
                // As for a tool: with no verifiers the answer rides with
                // the step's end, the commit that first uses it (in any
                // lane: see `Deferred`).
                let defer = def.verify.is_empty();
                let _worker = match self.worker(scope).await {
                    Ok(w) => w,
                    Err(stop) => return Ok(stop.into()),
                };
                self.model_attempt(def, m, at, defer, scope).await?
            }
            StepKind::Conditional(c) => (
                Value::Null,
                self.clone()
                    .conditional_attempt(def, c, at.iteration, &group)
                    .await?,
            ),
            StepKind::Parallel(p) => (
                Value::Null,
                self.clone()
                    .parallel_attempt(def, p, at.iteration, &group)
                    .await?,
            ),
            StepKind::SubWorkflow(s) => (
                Value::Null,
                self.clone().subworkflow_attempt(def, s, at, &group).await?,
            ),
            StepKind::Judgment(j) => (Value::Null, self.judgment_attempt(def, j, at).await?),
        };
        drop(timer);
        // The group stopped and the step's own scope did not: its timeout.
        let end = match (bounded, group.stopped(), scope.stopped()) {
            (Some(_), Some(_), None) => StepEnd::Failed(Failure::new(
                FailureClass::Timeout,
                format!(
                    "step `{}` did not finish within its timeout of {} ms; what it was running was stopped",
                    def.id,
                    def.timeout.map_or(0, |t| t.0)
                ),
            )),
            _ => end,
        };
        let end = match end {
            StepEnd::Completed(output) if !def.verify.is_empty() => {
                self.verify(def, at, &input, output, scope).await?
            }
            other => other,
        };
        match end {
            StepEnd::Completed(output) if !def.rubric.criteria.is_empty() => {
                self.step_rubric(def, at, &input, output, scope).await
            }
            other => Ok(other),
        }
    }

    /// The step's rubric on an attempt's output: recorded, then it decides.
    async fn step_rubric(
        &self,
        def: &StepDef,
        at: AttemptId,
        input: &Value,
        output: Value,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        let recorded = self
            .snapshot()
            .await
            .steps
            .get(&def.id)
            .filter(|s| s.iteration == at.iteration && s.attempt == at.attempt)
            .and_then(|s| s.current.rubric.clone());
        let verdict = match recorded {
            Some(v) => v,
            None => {
                let timeout = def.effective_timeout().as_duration();
                let v = match self
                    .score_rubric(&def.rubric, input, &output, timeout, scope)
                    .await?
                {
                    Scored::Verdict(v) => v,
                    Scored::Stopped(stop) => return Ok(stop.into()),
                };
                // Queued for the attempt's end, as verdicts are (`verify`).
                self.defer(vec![EpisodeEvent::RubricScored {
                    step: Some(def.id.clone()),
                    iteration: Some(at.iteration),
                    attempt: Some(at.attempt),
                    verdict: v.clone(),
                }]);
                v
            }
        };
        Ok(if verdict.passed {
            StepEnd::Completed(output)
        } else {
            StepEnd::Failed(Failure::new(
                FailureClass::Verifier,
                super::rubric::rejection(&verdict),
            ))
        })
    }

    async fn verify(
        &self,
        def: &StepDef,
        at: AttemptId,
        input: &Value,
        output: Value,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        let snap = self.snapshot().await;
        let recorded = snap
            .steps
            .get(&def.id)
            .filter(|s| s.iteration == at.iteration && s.attempt == at.attempt)
            .and_then(|s| s.current.verdicts.clone());
        let verdicts = match recorded {
            Some(v) => v,
            None => {
                let mut calls = Vec::new();
                for v in &def.verify {
                    let Some(identity) = snap.verifiers.get(&v.verifier.to_string()).cloned()
                    else {
                        return Err(Inconsistency::NotPinned {
                            what: "verifier",
                            name: v.verifier.to_string(),
                            step: def.id.clone(),
                        }
                        .into());
                    };
                    let call = VerifierCall {
                        verifier: identity.clone(),
                        input: input.clone(),
                        output: output.clone(),
                        config: v.config.clone(),
                        timeout: def.effective_timeout().as_duration(),
                    };
                    let tools = self.kernel.tools.clone();
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
                let verdicts = match scope.guard(futures::future::join_all(calls)).await {
                    Ok(v) => v,
                    Err(stop) => return Ok(stop.into()),
                };
                // Queued for the attempt's end, the next commit of this
                // lane: verdicts have no effect outside the run, and a
                // crash before that commit only takes them again (the
                // call's outcome they judged is durable: `AfterCall`).
                self.defer(vec![EpisodeEvent::Verified {
                    step: def.id.clone(),
                    iteration: at.iteration,
                    attempt: at.attempt,
                    verdicts: verdicts.clone(),
                }]);
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
        Ok(if rejections.is_empty() {
            StepEnd::Completed(output)
        } else {
            StepEnd::Failed(Failure::new(FailureClass::Verifier, rejections.join("; ")))
        })
    }
}
