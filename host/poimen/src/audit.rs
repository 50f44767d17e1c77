//! A run's audit, typed: its intent records, its tool calls and verifier
//! verdicts with their hostcall records, and the intent triples that are
//! incomplete.
//!
//! Built from what the store holds (the run's record, intents and
//! episode); it reads nothing else and changes nothing. It knows the
//! executor's event vocabulary and the sandbox's record type, not how
//! either is produced.

use std::collections::BTreeMap;

use poimen_executor::episode::{CallOutcome, VerdictOutcome};
use poimen_executor::{Episode, EpisodeEvent, ToolIdentity};
use poimen_sandbox::HostcallRecord;
use poimen_store::{IntentPhase, IntentRecord, RunRecord};
use poimen_workflow::{Capability, EffectClass, StepId};
use serde::Serialize;
use serde_json::Value;

/// Everything recorded about a run's effects.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    pub run: RunRecord,
    pub intents: Vec<IntentRecord>,
    /// Every tool call, in episode order.
    pub tool_calls: Vec<ToolCallAudit>,
    /// Every attempt's verifier verdicts, in episode order.
    pub verdicts: Vec<VerificationAudit>,
    /// Intent triples that are incomplete (a call without Pending,
    /// Dispatched and a final phase): empty unless something bypassed the
    /// intent wrapper or a run is still in flight.
    pub incomplete: Vec<String>,
}

/// One tool call, as its `tool_called` event recorded it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallAudit {
    /// The event's place in the episode.
    pub seq: u64,
    pub step: StepId,
    pub iteration: u32,
    pub attempt: u32,
    pub tool: ToolIdentity,
    pub effect: EffectClass,
    pub args: Value,
    pub args_hash: String,
    pub idempotency_key: String,
    pub capabilities: Vec<Capability>,
    pub outcome: CallOutcome,
    /// Written by an operator's `reconcile`, not by a call.
    pub reconciled: bool,
    pub record: CallRecord,
}

/// What stands behind a recorded call.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum CallRecord {
    /// The sandbox's record of the guest call.
    Hostcall(Box<HostcallRecord>),
    /// No guest call: an operator's reconciliation
    /// (`{"reconciled_by": "operator", "decision": …}`), or a record this
    /// version of poimen cannot read, kept as stored.
    Other(Value),
}

impl CallRecord {
    fn of(value: &Value) -> CallRecord {
        match serde_json::from_value::<HostcallRecord>(value.clone()) {
            Ok(r) => CallRecord::Hostcall(Box::new(r)),
            Err(_) => CallRecord::Other(value.clone()),
        }
    }

    /// The sandbox's record, if a guest call stands behind this one.
    pub fn hostcall(&self) -> Option<&HostcallRecord> {
        match self {
            CallRecord::Hostcall(r) => Some(r),
            CallRecord::Other(_) => None,
        }
    }
}

/// The verifiers of one attempt, as its `verified` event recorded them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerificationAudit {
    pub seq: u64,
    pub step: StepId,
    pub iteration: u32,
    pub attempt: u32,
    pub verdicts: Vec<VerdictAudit>,
}

/// One verifier's verdict and its record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictAudit {
    pub verifier: ToolIdentity,
    pub config: Value,
    pub outcome: VerdictOutcome,
    pub record: CallRecord,
}

impl Audit {
    /// The audit of a run from its record, intents and episode.
    pub(crate) fn of(run: RunRecord, intents: Vec<IntentRecord>, episode: &Episode) -> Audit {
        let mut tool_calls = Vec::new();
        let mut verdicts = Vec::new();
        for r in &episode.events {
            match &r.event {
                EpisodeEvent::ToolCalled {
                    step,
                    iteration,
                    attempt,
                    tool,
                    effect,
                    args,
                    args_hash,
                    idempotency_key,
                    capabilities,
                    record,
                    outcome,
                    reconciled,
                } => tool_calls.push(ToolCallAudit {
                    seq: r.seq,
                    step: step.clone(),
                    iteration: *iteration,
                    attempt: *attempt,
                    tool: tool.clone(),
                    effect: *effect,
                    args: args.clone(),
                    args_hash: args_hash.clone(),
                    idempotency_key: idempotency_key.clone(),
                    capabilities: capabilities.clone(),
                    outcome: outcome.clone(),
                    reconciled: *reconciled,
                    record: CallRecord::of(record),
                }),
                EpisodeEvent::Verified {
                    step,
                    iteration,
                    attempt,
                    verdicts: vs,
                } => verdicts.push(VerificationAudit {
                    seq: r.seq,
                    step: step.clone(),
                    iteration: *iteration,
                    attempt: *attempt,
                    verdicts: vs
                        .iter()
                        .map(|v| VerdictAudit {
                            verifier: v.verifier.clone(),
                            config: v.config.clone(),
                            outcome: v.outcome.clone(),
                            record: CallRecord::of(&v.record),
                        })
                        .collect(),
                }),
                _ => {}
            }
        }
        let incomplete = incomplete(&intents);
        Audit {
            run,
            intents,
            tool_calls,
            verdicts,
            incomplete,
        }
    }
}

/// The (step, iteration, attempt) triples whose intent phases are not a
/// whole protocol: Pending, Dispatched and a final phase — or a final
/// phase alone, written by a reconciliation.
fn incomplete(intents: &[IntentRecord]) -> Vec<String> {
    let mut phases: BTreeMap<(String, u32, u32), Vec<IntentPhase>> = BTreeMap::new();
    for i in intents {
        phases
            .entry((i.step.to_string(), i.iteration, i.attempt))
            .or_default()
            .push(i.phase);
    }
    phases
        .iter()
        .filter(|(_, ps)| {
            use IntentPhase::*;
            let reconciled = ps.first() == Some(&Committed) || ps.first() == Some(&Failed);
            !(reconciled
                || (ps.contains(&Pending)
                    && ps.contains(&Dispatched)
                    && ps
                        .last()
                        .is_some_and(|p| matches!(p, Committed | Failed | Abandoned))))
        })
        .map(|((s, it, at), ps)| {
            format!(
                "step `{s}` iteration {it} attempt {at}: {}",
                ps.iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(" → ")
            )
        })
        .collect()
}
