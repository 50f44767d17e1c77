//! The operator's ways back into a run: cancel, retry from a step,
//! reconcile a tool call whose outcome is unknown, and recovery of the runs
//! this host left in flight.

use std::collections::BTreeMap;
use std::sync::Arc;

use poimen_store::{IntentPhase, IntentRecord, RunId, RunRecord, RunStatus, Store, StoreError};
use poimen_workflow::StepId;
use serde_json::Value;

use super::{Executor, Operation, OperatorError, RunError};
use crate::effects::{Failure, FailureClass, ToolIdentity};
use crate::episode::{CallOutcome, EpisodeEvent, Reconciliation, StepStatus};
use crate::hash::hash_json;
use crate::run::{self, Batch, RunOutcome, StatusChange};
use crate::state::RunState;

/// How often a cancel retries when the run's driver moved its episode on.
const CANCEL_TRIES: usize = 20;

impl Executor {
    /// Appends a batch to a run no task of this host is driving, after the
    /// last event of `state`.
    pub(super) async fn append(
        &self,
        store: &dyn Store,
        run: &RunId,
        state: &RunState,
        batch: Batch,
    ) -> Result<(), poimen_store::StoreError> {
        let first = state.last_seq.map_or(0, |s| s + 1);
        let mut batch = batch;
        let events = std::mem::take(&mut batch.events);
        let (commit, _) =
            run::store_commit(run, None, first, self.kernel.clock.now_ms(), events, batch);
        store.commit(commit).await
    }

    /// Cancels a run: in-flight guests are interrupted, branches stopped,
    /// child runs cancelled, and no intent is left dangling.
    pub async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord, OperatorError> {
        if let Some(scope) = self.kernel.driving(run) {
            scope.cancel_run();
            // The driver records the cancellation; wait for it to land.
            for _ in 0..500 {
                let rec = self.status(run).await?;
                if rec.status.is_terminal() {
                    return Ok(rec);
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            return Ok(self.status(run).await?);
        }
        // Another host may be driving the run: the cancel (unfenced) ends
        // its tenure, and that host stops at its next write or heartbeat.
        // A write of that host landing first moves the episode on: read it
        // again and retry.
        let mut tries = 0;
        loop {
            match self.cancel_stopped(run, reason).await {
                Err(OperatorError::Run(RunError::Store(StoreError::SequenceConflict {
                    ..
                }))) if tries < CANCEL_TRIES => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        Ok(self.status(run).await?)
    }

    /// Cancels a run that no task of this host is driving.
    async fn cancel_stopped(&self, run: &RunId, reason: &str) -> Result<(), OperatorError> {
        let (store, rec) = self.locate(run).await?;
        if rec.status.is_terminal() {
            return Err(OperatorError::WrongStatus {
                run: run.clone(),
                status: rec.status,
                operation: Operation::Cancel,
            });
        }
        // Children first, so nothing below the run is left running.
        for child in store.children(run).await? {
            if !child.status.is_terminal() {
                Box::pin(self.cancel_stopped(&child.id, reason)).await?;
            }
        }
        let state = run::state(&*store, run).await?;
        let intents = store.intents(run).await?;
        // Close every intent left open, claiming no more than is known: a
        // call never dispatched did not happen (failed); a dispatched one
        // may or may not have had its effect (abandoned: outcome unknown).
        let mut last: BTreeMap<(StepId, u32, u32), &IntentRecord> = BTreeMap::new();
        for i in &intents {
            last.insert((i.step.clone(), i.iteration, i.attempt), i);
        }
        let now = self.kernel.clock.now_ms();
        let closing: Vec<IntentRecord> = last
            .values()
            .filter_map(|i| {
                let (phase, error) = match i.phase {
                    IntentPhase::Pending => (
                        IntentPhase::Failed,
                        format!("cancelled before it was dispatched: {reason}"),
                    ),
                    IntentPhase::Dispatched => (
                        IntentPhase::Abandoned,
                        format!("cancelled with its outcome unknown: {reason}"),
                    ),
                    _ => return None,
                };
                Some(IntentRecord {
                    phase,
                    error: Some(error),
                    output_hash: None,
                    record: None,
                    at: now,
                    ..(*i).clone()
                })
            })
            .collect();
        let batch = Batch {
            intents: closing,
            ..Batch::status(
                vec![EpisodeEvent::RunCancelled {
                    reason: reason.to_owned(),
                }],
                StatusChange::because(RunStatus::Cancelled, reason),
            )
        };
        self.append(&*store, run, &state, batch).await?;
        Ok(())
    }

    /// Goes again from a step of a failed run (by default the step that
    /// failed): that step and every later top-level step run as new
    /// iterations; the history stays in the episode.
    pub async fn retry(
        &self,
        run: &RunId,
        from: Option<StepId>,
    ) -> Result<RunOutcome, OperatorError> {
        let (store, rec) = self.locate(run).await?;
        // The store keeps completed and cancelled runs final.
        if rec.status != RunStatus::Failed {
            return Err(OperatorError::WrongStatus {
                run: run.clone(),
                status: rec.status,
                operation: Operation::Retry,
            });
        }
        let state = run::state(&*store, run).await?;
        let runnable = self.runnable_of(&*store, &rec).await?;
        let shape = &runnable.shape;
        let top_level: Vec<StepId> = shape.ready_order().cloned().collect();
        let from = match from {
            Some(f) => {
                if !top_level.contains(&f) {
                    return Err(OperatorError::NotTopLevel {
                        run: run.clone(),
                        step: f,
                        top_level,
                    });
                }
                f
            }
            None => top_level
                .iter()
                .find(|s| state.steps.get(*s).map(|x| x.status) != Some(StepStatus::Completed))
                .cloned()
                .ok_or_else(|| OperatorError::NothingToRetry {
                    run: run.clone(),
                    status: rec.status,
                })?,
        };
        let start = top_level.iter().position(|s| *s == from).unwrap_or(0);
        let mut reset: Vec<StepId> = Vec::new();
        for &top in &shape.order()[start..] {
            reset.push(shape.id(top).clone());
            for owned in shape.owned_closure(top) {
                let id = shape.id(owned);
                if !reset.contains(id) {
                    reset.push(id.clone());
                }
            }
        }
        self.append(
            &*store,
            run,
            &state,
            Batch::status(
                vec![EpisodeEvent::RunRetried { from, reset }],
                StatusChange::to(RunStatus::Running),
            ),
        )
        .await?;
        Ok(self.resume(run).await?)
    }

    /// Records an operator's decision on a blocked tool call and resumes.
    pub async fn reconcile(
        &self,
        run: &RunId,
        step: &StepId,
        decision: Reconciliation,
    ) -> Result<RunOutcome, OperatorError> {
        let (store, rec) = self.locate(run).await?;
        if rec.status != RunStatus::Blocked {
            return Err(OperatorError::WrongStatus {
                run: run.clone(),
                status: rec.status,
                operation: Operation::Reconcile,
            });
        }
        let state = run::state(&*store, run).await?;
        let intents = store.intents(run).await?;
        // The open intent: dispatched, never closed.
        let mut open: BTreeMap<(u32, u32), Vec<&IntentRecord>> = BTreeMap::new();
        for i in intents.iter().filter(|i| &i.step == step) {
            open.entry((i.iteration, i.attempt)).or_default().push(i);
        }
        let dispatched = open.into_iter().rev().find_map(|(at, phases)| {
            phases
                .last()
                .filter(|p| p.phase == IntentPhase::Dispatched)
                .map(|last| (at, (*last).clone()))
        });
        let Some(((iteration, attempt), last)) = dispatched else {
            return Err(OperatorError::NoOpenCall {
                run: run.clone(),
                step: step.clone(),
                in_flight: state
                    .steps
                    .iter()
                    .filter(|(_, s)| s.status == StepStatus::Running)
                    .map(|(id, _)| id.clone())
                    .collect(),
            });
        };
        let (outcome, phase, output_hash, error) = match &decision {
            Reconciliation::Committed { output } => {
                let h = hash_json(output);
                (
                    CallOutcome::Ok {
                        output: Arc::new(output.clone()),
                        output_hash: h.clone(),
                    },
                    IntentPhase::Committed,
                    Some(h),
                    None,
                )
            }
            Reconciliation::Failed { reason } => (
                CallOutcome::Err {
                    failure: Failure::new(
                        FailureClass::Failed,
                        format!("reconciled as failed: {reason}"),
                    ),
                },
                IntentPhase::Failed,
                None,
                Some(reason.clone()),
            ),
        };
        let now = self.kernel.clock.now_ms();
        let record = serde_json::json!({"reconciled_by": "operator", "decision": decision});
        let identity = ToolIdentity {
            name: last.tool.clone(),
            version: last.tool_version.clone(),
            digest: last.digest.clone(),
        };
        let final_intent = IntentRecord {
            phase,
            output_hash,
            error,
            record: Some(record.clone()),
            at: now,
            ..last.clone()
        };
        let batch = Batch {
            intents: vec![final_intent],
            ..Batch::status(
                vec![
                    EpisodeEvent::Reconciled {
                        step: step.clone(),
                        iteration,
                        attempt,
                        decision: decision.clone(),
                    },
                    EpisodeEvent::ToolCalled {
                        step: step.clone(),
                        iteration,
                        attempt,
                        tool: identity,
                        effect: last.effect,
                        args: Value::Null,
                        args_hash: last.args_hash.clone(),
                        idempotency_key: last.idempotency_key.clone(),
                        capabilities: Vec::new(),
                        record,
                        outcome,
                        reconciled: true,
                    },
                    EpisodeEvent::RunResumed {
                        reason: "reconciled by an operator".into(),
                    },
                ],
                StatusChange::to(RunStatus::Running),
            )
        };
        let held = self.hold_root(run).await?;
        let written = async {
            self.append(&*store, run, &state, batch).await?;
            self.unblock_ancestors(run, RunStatus::Blocked, "a child run was reconciled")
                .await
        }
        .await;
        if let Err(e) = written {
            self.unhold(held).await;
            return Err(e.into());
        }
        Ok(self.resume_held(run, held).await?)
    }

    /// Marks the ancestors of `run` that stopped because of it as resumed.
    pub(super) async fn unblock_ancestors(
        &self,
        run: &RunId,
        because: RunStatus,
        reason: &str,
    ) -> Result<(), RunError> {
        let (_, mut rec) = self.locate(run).await?;
        while let Some((parent, _)) = rec.parent.clone() {
            let (store, prec) = self.locate(&parent).await?;
            if prec.status == because {
                let state = run::state(&*store, &parent).await?;
                self.append(
                    &*store,
                    &parent,
                    &state,
                    Batch::status(
                        vec![EpisodeEvent::RunResumed {
                            reason: reason.to_owned(),
                        }],
                        StatusChange::to(RunStatus::Running),
                    ),
                )
                .await?;
            }
            rec = prec;
        }
        Ok(())
    }

    /// Finds the runs left in flight and drives them again: each is claimed
    /// first, so a run another live host holds is left to it (its outcome
    /// is reported as recorded, with the holder as its reason).
    pub async fn recover(&self) -> Result<Vec<RunOutcome>, RunError> {
        let runs = self.kernel.store.in_flight_runs().await?;
        let mut out = Vec::new();
        for r in runs {
            if r.status == RunStatus::Running && r.parent.is_none() {
                match self.resume(&r.id).await {
                    Ok(o) => out.push(o),
                    // Another live host drives it: leave it to that host.
                    Err(held @ RunError::Held { .. }) => {
                        let mut o = self.recorded_outcome(&r.id).await?;
                        o.reason = Some(held.to_string());
                        out.push(o);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(out)
    }
}
