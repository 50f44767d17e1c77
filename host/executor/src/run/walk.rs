//! The walk: top-level steps one at a time in the shape's ready order,
//! bounded loops, the run's limits and budget between steps, the run's
//! output, and how the walk's stop becomes a recorded run status.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use poimen_store::{BlobHash, RunStatus};
use tracing::Instrument;

use super::rubric::Scored;
use super::{
    Batch, CommitError, Halt, Inconsistency, LANE, Lane, RunCtx, RunFailure, RunOutcome,
    StatusChange, StepEnd,
};
use crate::episode::{EpisodeEvent, StepStatus};
use crate::hash::canonical_json;
use crate::render::{context, eval_predicate, render_args, template_context};
use crate::scope::Interruption;
use crate::state::RunState;

impl RunCtx {
    /// Drives the run until it ends or must wait.
    pub fn drive(self: Arc<Self>) -> BoxFuture<'static, RunOutcome> {
        let span = tracing::info_span!(
            "run",
            workflow = %self.runnable.def.id,
            version = %self.runnable.version,
            run = %self.run,
            tenant = %self.scope.tenant,
            depth = self.depth,
        );
        // A run driven away from its starter (claimed from the queue,
        // taken over, resumed), outside any span, continues the starter's
        // trace; one driven in its starter's request is that span's child.
        if let (Some(trace), Some(parent)) = (&self.trace, &self.kernel.config.trace_parent)
            && tracing::Span::current().is_none()
        {
            (parent.0)(&span, trace);
        }
        // The walk is the run's spine lane (see `Deferred`), whatever lane
        // the task driving it is in (a child run driven by a branch).
        LANE.scope(Lane::Spine, async move {
            let timers = self.start_timers().await;
            let halt = match self.wake_if_due().await {
                Ok(()) => self.clone().walk().await,
                Err(h) => Err(h),
            };
            drop(timers);
            self.conclude(halt).await
        })
        .instrument(span)
        .boxed()
    }

    async fn walk(self: Arc<Self>) -> Result<(), Halt> {
        // Where the search for the next step starts in the shape's order:
        // every step before it is completed or skipped, and stays so until
        // a loop edge is taken (which resets its body, and the cursor), so
        // a long chain is not scanned from its head at every step.
        let mut from = 0usize;
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
                    return Err(Inconsistency::NeverStarted.into());
                }
            }
            self.check_limits(&snap)?;
            let shape = &self.runnable.shape;
            let status = |i: usize| {
                snap.steps
                    .get(shape.id(i))
                    .map(|s| s.status)
                    .unwrap_or_default()
            };
            let order = shape.order();
            while order
                .get(from)
                .is_some_and(|&i| matches!(status(i), StepStatus::Completed | StepStatus::Skipped))
            {
                from += 1;
            }
            let next = order[from..].iter().copied().find(|&i| match status(i) {
                StepStatus::Running | StepStatus::Waiting => true,
                StepStatus::Pending => shape
                    .predecessors(i)
                    .iter()
                    .all(|&p| status(p) == StepStatus::Completed),
                _ => false,
            });
            let Some(next) = next.map(|i| shape.id(i).clone()) else {
                return self.complete(&snap).await;
            };
            // Not held across the step: its commits would copy the state.
            drop(snap);
            match self
                .clone()
                .exec_step(next.clone(), None, self.scope.clone())
                .await?
            {
                StepEnd::Completed(_) => {
                    if self.maybe_loop(&next).await? {
                        from = 0;
                    }
                }
                StepEnd::Failed(failure) => {
                    return Err(Halt::Fail(RunFailure::StepFailed {
                        step: next,
                        failure,
                    }));
                }
                StepEnd::Lost | StepEnd::Cancelled => return Err(Halt::Cancelled),
            }
        }
    }

    fn check_limits(&self, snap: &RunState) -> Result<(), Halt> {
        let def = &self.runnable.def;
        let now = self.kernel.clock.now_ms();
        let elapsed = u64::try_from(now.saturating_sub(snap.started_at)).unwrap_or(0);
        let fail = |f: RunFailure| Err(Halt::Fail(f));
        if let Some(deadline) = def.limits.deadline
            && elapsed > deadline.0
        {
            return fail(RunFailure::Deadline {
                elapsed_ms: elapsed,
                limit_ms: deadline.0,
            });
        }
        if let Some(max) = def.budget.wall_time {
            let active = elapsed.saturating_sub(snap.spent.waiting_ms);
            if active > max.0 {
                return fail(RunFailure::WallTime {
                    active_ms: active,
                    budget_ms: max.0,
                });
            }
        }
        if let Some(max) = def.budget.tokens
            && snap.spent.tokens > max
        {
            return fail(RunFailure::Tokens {
                used: snap.spent.tokens,
                budget: max,
            });
        }
        if let Some(max) = def.budget.tool_calls
            && snap.spent.tool_calls > max
        {
            return fail(RunFailure::ToolCalls {
                made: snap.spent.tool_calls,
                budget: max,
            });
        }
        Ok(())
    }

    /// Takes the back-edge leaving `from`, if it is bounded and still open.
    /// Takes the loop edge from `from` if it has one and its condition
    /// holds; whether it was taken (the loop's body is then pending again).
    async fn maybe_loop(&self, from: &poimen_workflow::StepId) -> Result<bool, Halt> {
        let shape = &self.runnable.shape;
        let Some(edge) = shape
            .lookup(from.as_str())
            .and_then(|i| shape.back_edge_from(i))
        else {
            return Ok(false);
        };
        let transition = &self.runnable.def.transitions[edge.transition];
        let Some(max) = transition.max_iterations else {
            return Ok(false);
        };
        let snap = self.snapshot().await;
        let taken = snap.loops.get(from).copied().unwrap_or(0);
        if taken >= max.get() {
            return Ok(false);
        }
        if let Some(when) = &transition.when {
            let go = eval_predicate(&when.0, &context(&snap)).map_err(|cause| {
                Halt::Fail(RunFailure::LoopCondition {
                    from: from.clone(),
                    to: transition.to.clone(),
                    cause,
                })
            })?;
            if !go {
                return Ok(false);
            }
        }
        // Not held across the commit: it would copy the state.
        drop(snap);
        let body = shape
            .loop_body(edge.from, edge.to)
            .into_iter()
            .map(|i| shape.id(i).clone())
            .collect();
        self.record(vec![EpisodeEvent::LoopIterated {
            from: from.clone(),
            to: transition.to.clone(),
            taken: taken + 1,
            body,
        }])
        .await?;
        Ok(true)
    }

    /// All top-level steps completed: build, check and record the output.
    async fn complete(&self, snap: &Arc<RunState>) -> Result<(), Halt> {
        let def = &self.runnable.def;
        let output = match &def.output {
            Some(t) => render_args(&t.0, &template_context(snap))
                .map_err(|e| Halt::Fail(RunFailure::OutputTemplate(e)))?,
            None => snap
                .completed_order
                .last()
                .and_then(|s| snap.steps.get(s))
                .and_then(|s| s.output.clone())
                .unwrap_or(serde_json::Value::Null),
        };
        if let Some(schema) = &self.runnable.schemas.outputs {
            schema
                .check(&output)
                .map_err(|v| Halt::Fail(RunFailure::OutputSchema(v)))?;
        }
        // `completed` means every declared postcondition passed: the
        // workflow's rubric scores the result, and decides.
        if !def.rubric.criteria.is_empty() {
            let verdict = match &snap.rubric {
                Some(v) => v.clone(),
                None => {
                    let timeout = poimen_workflow::DEFAULT_STEP_TIMEOUT.as_duration();
                    let scored = self
                        .score_rubric(&def.rubric, &snap.input, &output, timeout, &self.scope)
                        .await?;
                    let Scored::Verdict(v) = scored else {
                        return Err(Halt::Cancelled);
                    };
                    self.record(vec![EpisodeEvent::RubricScored {
                        step: None,
                        iteration: None,
                        attempt: None,
                        verdict: v.clone(),
                    }])
                    .await?;
                    v
                }
            };
            if !verdict.passed {
                return Err(Halt::Fail(RunFailure::Rubric(verdict)));
            }
        }
        let bytes = canonical_json(&output);
        if let Some(limit) = self.kernel.config.output_bytes
            && bytes.len() as u64 > limit
        {
            return Err(Halt::Fail(RunFailure::OutputTooLarge {
                bytes: bytes.len() as u64,
                limit,
            }));
        }
        let blob = BlobHash::of(&bytes);
        self.commit(Batch {
            blobs: vec![bytes],
            ..Batch::status(
                vec![EpisodeEvent::RunCompleted {
                    output,
                    output_hash: blob.to_string(),
                }],
                StatusChange {
                    output_hash: Some(blob),
                    ..StatusChange::to(RunStatus::Completed)
                },
            )
        })
        .await?;
        Ok(())
    }

    /// Turns how the walk stopped into a recorded run status.
    async fn conclude(&self, result: Result<(), Halt>) -> RunOutcome {
        // Interrupted, not cancelled: a limit passed, or the version was
        // unloaded.
        let result = match (result, self.scope.interruption()) {
            (Err(Halt::Cancelled), Some(why)) => Err(match why {
                Interruption::Deadline {
                    elapsed_ms,
                    limit_ms,
                } => Halt::Fail(RunFailure::Deadline {
                    elapsed_ms: *elapsed_ms,
                    limit_ms: *limit_ms,
                }),
                Interruption::WallTime {
                    active_ms,
                    budget_ms,
                } => Halt::Fail(RunFailure::WallTime {
                    active_ms: *active_ms,
                    budget_ms: *budget_ms,
                }),
                Interruption::Unloaded { .. } => Halt::Unloaded,
            }),
            (other, _) => other,
        };
        let written = match result {
            Ok(()) | Err(Halt::Blocked) => Ok(()),
            Err(Halt::Waiting) => {
                self.set_timer().await;
                Ok(())
            }
            Err(Halt::Unloaded) => {
                let reason =
                    "cancelled: its version was unloaded and the drain timeout passed".to_owned();
                self.commit(Batch::status(
                    vec![EpisodeEvent::RunCancelled {
                        reason: reason.clone(),
                    }],
                    StatusChange::because(RunStatus::Cancelled, reason),
                ))
                .await
                .map_err(Halt::from)
            }
            Err(Halt::Cancelled) => {
                let reason = "cancelled by request".to_owned();
                self.commit(Batch::status(
                    vec![EpisodeEvent::RunCancelled {
                        reason: reason.clone(),
                    }],
                    StatusChange::because(RunStatus::Cancelled, reason),
                ))
                .await
                .map_err(Halt::from)
            }
            Err(Halt::Fail(failure)) => self.fail(failure).await.map_err(Halt::from),
            Err(Halt::Inconsistent(e)) => self
                .fail(RunFailure::Inconsistent(e))
                .await
                .map_err(Halt::from),
            Err(h @ Halt::Store(_)) => Err(h),
        };
        let mut outcome = RunOutcome::of(&self.run, Arc::unwrap_or_clone(self.snapshot().await));
        match written {
            Ok(()) => {}
            // The store cannot take writes: report the cause; the stored run
            // keeps its last recorded status (never a false success) and is
            // recovered when the store is writable again.
            Err(Halt::Store(e)) => {
                outcome.reason = Some(format!(
                    "the store refused a write, the run stopped where its episode ends: {e}"
                ));
            }
            Err(other) => outcome.reason = Some(format!("{other:?}")),
        }
        outcome
    }

    async fn fail(&self, failure: RunFailure) -> Result<(), CommitError> {
        let reason = failure.to_string();
        self.commit(Batch::status(
            vec![EpisodeEvent::RunFailed {
                reason: reason.clone(),
                step: failure.step().cloned(),
            }],
            StatusChange::because(RunStatus::Failed, reason),
        ))
        .await
    }
}
