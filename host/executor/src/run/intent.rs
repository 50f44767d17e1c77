//! The write-ahead intent wrapper: the only path from a run to a tool.
//!
//! `Pending`, `Dispatched` (durable before the guest is called), the call,
//! then `Committed` or `Failed` with the `tool_called` event (durable before
//! the run moves on). For a pure or idempotent tool `Pending` and
//! `Dispatched` share one durable commit: recovery treats the two alike for
//! such a tool (it dispatches again under the same key), so only a
//! non-idempotent call pays for the distinction — its `Pending` is a
//! buffered commit of its own, which the store writes ahead of
//! `Dispatched`'s fsync, so both are durable before the call and no crash
//! leaves `Dispatched` without `Pending`. On resume the recorded phases
//! decide: a committed call is replayed, a dispatched one is re-dispatched
//! with the same idempotency key when the tool is pure or idempotent, and
//! blocks the run as `outcome_unknown` otherwise.
//!
//! The step's start rides with its first intent commit and the outcome
//! with the step's end (see `Deferred` in `mod.rs`): two fsyncs per step
//! in every lane.
//!
//! A call that can have no effect outside its result — a pure component
//! that policy grants no network and no writable mount
//! ([`ToolHost::effect_free`](crate::ToolHost::effect_free)) — has nothing
//! for a write-ahead record to protect: making it twice is the same as
//! making it once. Its `Pending` and `Dispatched` are queued with the
//! step's start and go in with its outcome, in one fsynced commit: one
//! commit and one fsync per step. The outcome is durable before the run
//! moves on, as for any call; a crash before that commit loses the call,
//! and recovery makes it again. A workflow registered as a tool is never
//! treated so (its call starts a child run).

use std::sync::Arc;

use poimen_store::{Durability, IntentPhase, IntentRecord, RunStatus};
use poimen_workflow::{EffectClass, StepDef, ToolRef};
use serde_json::Value;
use tracing::Instrument;

use super::attempt::{AfterCall, AttemptId};
use super::{Batch, Halt, Inconsistency, RunCtx, RunFailure, StatusChange, StepEnd};
use crate::crash::crash_point;
use crate::effects::{Failure, FailureClass, ToolCall};
use crate::episode::{CallOutcome, EpisodeEvent};
use crate::hash::{hash_json, idempotency_key};
use crate::scope::{RunScope, Stop};

impl RunCtx {
    /// Calls a tool through the intent protocol (see the module docs).
    ///
    /// The outcome is queued for the step's end commit (fsynced) when
    /// `after` allows it (see [`AfterCall`] and `Deferred`).
    pub(super) async fn call_tool(
        &self,
        def: &StepDef,
        tool: &ToolRef,
        args: Value,
        at: AttemptId,
        after: AfterCall,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        let AttemptId { iteration, attempt } = at;
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
            return Ok(recorded.into_result().into());
        }
        let Some(pinned) = snap.tools.get(&tool.to_string()).cloned() else {
            return Err(Inconsistency::NotPinned {
                what: "tool",
                name: tool.to_string(),
                step: def.id.clone(),
            }
            .into());
        };
        // Not held across the call: its commits would copy the state.
        let tool_calls_spent = snap.spent.tool_calls;
        drop(snap);
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
            at: self.kernel.clock.now_ms(),
        };
        // Nothing outside the result can come of an effect-free call (a
        // pure component granted no network and no writable mount).
        let free = pinned.workflow.is_none()
            && pinned.effect == EffectClass::Pure
            && self.kernel.tools.effect_free(&pinned.identity);
        let dispatched = || {
            Batch::intents(
                Vec::new(),
                vec![intent(IntentPhase::Dispatched, None, None, None)],
            )
        };
        match self.phases(&def.id, iteration, attempt).last() {
            Some(IntentPhase::Dispatched) => {
                if pinned.effect == EffectClass::NonIdempotent {
                    let reason = format!(
                        "outcome_unknown: step `{}` dispatched non-idempotent tool `{}` (idempotency key {key}) and no outcome was recorded; it is never replayed automatically — run `poimen reconcile {} {} --committed OUTPUT` or `--failed REASON`",
                        def.id, pinned.identity.name, self.run, def.id
                    );
                    self.commit(Batch::status(
                        vec![EpisodeEvent::RunBlocked {
                            step: def.id.clone(),
                            iteration,
                            attempt,
                            reason: reason.clone(),
                        }],
                        StatusChange::because(RunStatus::Blocked, reason),
                    ))
                    .await?;
                    return Err(Halt::Blocked);
                }
                // Pure or idempotent: dispatch again under the same key.
                self.commit(dispatched()).await?;
            }
            Some(IntentPhase::Pending) => {
                crash_point("after_pending");
                self.commit(dispatched()).await?;
                crash_point("after_dispatched");
            }
            Some(IntentPhase::Committed | IntentPhase::Failed | IntentPhase::Abandoned) => {
                return Err(Inconsistency::FinalIntentWithoutCall {
                    step: def.id.clone(),
                    attempt,
                }
                .into());
            }
            None => {
                if let Some(max) = self.runnable.def.budget.tool_calls
                    && tool_calls_spent >= max
                {
                    return Err(Halt::Fail(RunFailure::ToolCallBudget {
                        step: def.id.clone(),
                        budget: max,
                    }));
                }
                crash_point("before_pending");
                if free {
                    // Nothing outside the result can come of this call, so
                    // nothing is written ahead of it: `Pending` and
                    // `Dispatched` ride with its outcome, and with it join
                    // the run's unwritten tail (`Tail` in `run/mod.rs`),
                    // written with the next commit that must be durable. A
                    // crash before that leaves no trace of the step, which
                    // is then made again — all that making it again can do.
                    self.defer_intents(vec![
                        intent(IntentPhase::Pending, None, None, None),
                        intent(IntentPhase::Dispatched, None, None, None),
                    ]);
                    crash_point("after_pending");
                } else if pinned.effect == EffectClass::NonIdempotent {
                    // `Pending` on its own: a crash before `Dispatched`
                    // leaves a call known not to have been made, which
                    // recovery makes instead of blocking the run.
                    self.commit(Batch {
                        intents: vec![intent(IntentPhase::Pending, None, None, None)],
                        ..Batch::default()
                    })
                    .await?;
                    crash_point("after_pending");
                    self.commit(dispatched()).await?;
                } else {
                    // Pure or idempotent: recovery dispatches a dispatched
                    // call again exactly as it dispatches a pending one, so
                    // both phases go in one durable commit (one round trip
                    // to the store instead of two).
                    self.commit(Batch::intents(
                        Vec::new(),
                        vec![
                            intent(IntentPhase::Pending, None, None, None),
                            intent(IntentPhase::Dispatched, None, None, None),
                        ],
                    ))
                    .await?;
                    crash_point("after_pending");
                }
                crash_point("after_dispatched");
            }
        }
        let call = ToolCall {
            tool: pinned.identity.clone(),
            args: args.clone(),
            idempotency_key: key.clone(),
            timeout: def.effective_timeout().as_duration(),
        };
        let called = |args: Value, capabilities, record: Value, outcome| EpisodeEvent::ToolCalled {
            step: def.id.clone(),
            iteration,
            attempt,
            tool: pinned.identity.clone(),
            effect: pinned.effect,
            args,
            args_hash: args_hash.clone(),
            idempotency_key: key.clone(),
            capabilities,
            record,
            outcome,
            reconciled: false,
        };
        // Arguments appear only as their hash.
        let span = tracing::info_span!(
            "guest_call",
            tool = %pinned.identity.name,
            digest = %pinned.identity.digest,
            args_hash = %args_hash,
        );
        let result = match scope
            .guard(self.kernel.tools.invoke(call))
            .instrument(span)
            .await
        {
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
                self.commit(Batch::intents(
                    vec![called(
                        args,
                        Vec::new(),
                        Value::Null,
                        CallOutcome::Err {
                            failure: failure.clone(),
                        },
                    )],
                    // The guest was stopped mid-call: whether its effect
                    // happened is not known, and the record says so.
                    vec![intent(
                        IntentPhase::Abandoned,
                        None,
                        Some(format!("{failure}; its outcome is unknown")),
                        None,
                    )],
                ))
                .await?;
                return Ok(stop.into());
            }
        };
        crash_point("before_committed");
        let (outcome, phase, output_hash, error) = match result.outcome {
            Ok(output) => {
                let h = hash_json(&output);
                (
                    CallOutcome::Ok {
                        output: Arc::new(output),
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
        let events = vec![called(
            args,
            result.capabilities,
            result.record.clone(),
            outcome.clone(),
        )];
        let closed = vec![intent(phase, output_hash, error, Some(result.record))];
        if after == AfterCall::End {
            self.defer_outcome(events, closed, Vec::new(), !free, "after_committed");
        } else {
            // An effect-free call's outcome needs no fsync before its
            // verifiers run: lost, it is only made again.
            let durability = if free {
                Durability::Buffered
            } else {
                Durability::Sync
            };
            self.commit(Batch::intents(events, closed).durability(durability))
                .await?;
            crash_point("after_committed");
        }
        Ok(outcome.into_result().into())
    }
}
