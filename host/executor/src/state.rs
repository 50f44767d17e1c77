//! Run state as the fold of an episode.
//!
//! [`RunState::apply`] is the only way run state changes: the live
//! interpreter applies each event as it records it, and [`refold`] applies
//! the stored events to an empty state. Equality of the two
//! ([`assert_refold_identical`]) is the check that nothing the run knows is
//! missing from its episode. This module also owns the state reducers.
//! It knows nothing of how events are produced or stored.

use std::collections::BTreeMap;

use poimen_workflow::{Reducer, StepId, WorkflowDef, WorkflowId, WorkflowVersion};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::effects::{Failure, Usage};
use crate::effects::{JsonType, ToolIdentity};
use crate::episode::{
    CallOutcome, Episode, EpisodeEvent, ParentLink, PinnedChild, PinnedTool, Recorded,
    RubricVerdict, StepStatus, VerdictRecord,
};

/// Lifecycle status of a run, as the fold sees it.
pub use poimen_store::RunStatus;

/// What the current attempt of a step has recorded so far — replayed, not
/// repeated, when a run resumes mid-attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The tool call's recorded outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<CallOutcome>,
    /// The hash of the model request recorded before the call (the answer,
    /// once recorded, is `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_request: Option<String>,
    /// The child run requested (its id and version) before it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_request: Option<(poimen_store::RunId, WorkflowVersion)>,
    /// The step rubric's recorded verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<RubricVerdict>,
    /// The model's recorded answer (text) or failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Result<String, Failure>>,
    /// The tokens the provider reported for that answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_tokens: Option<u64>,
    /// The verifiers' recorded verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<Vec<VerdictRecord>>,
    /// The attempt's end, once recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<Option<Failure>>,
    /// Who acted in this attempt: `tool:NAME@VERSION DIGEST` or
    /// `model:PROVIDER/MODEL`, once recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Hash of what the action consumed: the tool's arguments or the
    /// rendered prompt's blob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_hash: Option<String>,
}

/// One step as the fold sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepState {
    pub status: StepStatus,
    /// The Parallel or Conditional step running this one, if it is owned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<StepId>,
    /// Executions started so far (loops re-enter a step).
    pub iteration: u32,
    /// Current (or last) attempt of the current execution.
    pub attempt: u32,
    /// When the current execution started (ms since the epoch, from its
    /// `step_started` record).
    #[serde(default)]
    pub started_at: i64,
    /// Output of the last completed execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Records of the current attempt.
    #[serde(default)]
    pub current: AttemptRecord,
    /// A conditional's recorded choice for the current execution:
    /// `Some(chosen)` once evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<Option<StepId>>,
    /// A parallel step's branches were forked for the current execution.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forked: bool,
    /// A parallel step's recorded join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined: Option<Join>,
    /// Order in which owned branches finished, for joins decided on resume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finish_order: Vec<StepId>,
    /// A sub-workflow step's child run for the current execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<ChildLink>,
    /// A judgment step's request for the current execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judgment: Option<JudgmentState>,
}

/// A recorded join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    pub winners: Vec<StepId>,
    pub losers: Vec<StepId>,
    pub failed: Vec<StepId>,
    /// The winners' state writes broke a contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// A sub-workflow step's child run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildLink {
    pub run: poimen_store::RunId,
    pub version: WorkflowVersion,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<(RunStatus, Option<Value>)>,
}

/// A judgment step's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgmentState {
    pub request_id: poimen_store::JudgmentId,
    pub request_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// When the open request expires unanswered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Requests of this attempt that expired (an escalation asks again).
    #[serde(default, skip_serializing_if = "u32_is_zero")]
    pub expired: u32,
}

fn u32_is_zero(n: &u32) -> bool {
    *n == 0
}

/// Resources a run has used, charged against its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spent {
    pub tokens: u64,
    pub tool_calls: u64,
    pub step_executions: u64,
    /// Milliseconds spent waiting outside the run (judgments), excluded from
    /// the wall-time budget.
    pub waiting_ms: u64,
}

/// The state of a run: exactly what its episode says.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    pub workflow_id: Option<WorkflowId>,
    pub version: Option<WorkflowVersion>,
    pub status: Option<RunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    pub tools: BTreeMap<String, PinnedTool>,
    pub verifiers: BTreeMap<String, ToolIdentity>,
    /// Each sub-workflow step's pinned child.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subworkflows: BTreeMap<StepId, PinnedChild>,
    /// The workflow rubric's verdict on the run's result, once scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<RubricVerdict>,
    /// Declared state keys and their values.
    pub state: BTreeMap<String, Value>,
    pub steps: BTreeMap<StepId, StepState>,
    /// Times each back-edge (keyed by its `from` step) has been taken.
    pub loops: BTreeMap<StepId, u32>,
    pub spent: Spent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Milliseconds of the run's start.
    pub started_at: i64,
    /// The starter's trace context (`run_started`'s `trace`): telemetry
    /// only, not part of the state shown.
    #[serde(skip)]
    pub trace: Option<crate::episode::TraceCarrier>,
    /// Milliseconds since which the run has been waiting, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<i64>,
    /// Top-level steps in the order they completed (the default run output
    /// is the last one's).
    pub completed_order: Vec<StepId>,
    /// Sequence number of the last applied event.
    pub last_seq: Option<u64>,
}

/// Why the state cannot take an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    #[error("event {seq} comes after {last:?}: the episode has a gap or is out of order")]
    OutOfOrder { seq: u64, last: Option<u64> },
    #[error("event {seq} ({kind}) refers to step `{step}`, which no earlier event started")]
    UnknownStep {
        seq: u64,
        kind: &'static str,
        step: StepId,
    },
}

impl RunState {
    /// What the run pinned at its start.
    pub fn pins(&self) -> crate::episode::Pins {
        crate::episode::Pins {
            tools: self.tools.clone(),
            verifiers: self.verifiers.clone(),
            subworkflows: self.subworkflows.clone(),
        }
    }

    /// The initial value of a declared state key under its reducer.
    pub fn initial_value(reducer: Reducer) -> Value {
        match reducer {
            Reducer::Overwrite => Value::Null,
            Reducer::Append | Reducer::Union => Value::Array(Vec::new()),
            Reducer::Merge => Value::Object(Default::default()),
        }
    }

    /// A fresh state with the workflow's declared keys at their initial values.
    pub fn declared(def: &WorkflowDef) -> BTreeMap<String, Value> {
        def.state
            .iter()
            .map(|(k, d)| {
                (
                    k.0.clone(),
                    Self::initial_value(d.reducer.unwrap_or_default()),
                )
            })
            .collect()
    }

    /// The step's state, creating it when first seen.
    fn step_mut(&mut self, step: &StepId) -> &mut StepState {
        self.steps.entry(step.clone()).or_default()
    }

    /// Applies one recorded event. This is the only mutation of run state.
    pub fn apply(&mut self, r: &Recorded) -> Result<(), FoldError> {
        self.apply_at(r.seq, r.at, &r.event)
    }

    /// [`apply`](Self::apply) of an event recorded as `seq` at `at`, read
    /// where it lies (a queued event is previewed without a copy).
    pub(crate) fn apply_at(
        &mut self,
        seq: u64,
        at: i64,
        event: &EpisodeEvent,
    ) -> Result<(), FoldError> {
        let expected = self.last_seq.map_or(0, |s| s + 1);
        if seq != expected {
            return Err(FoldError::OutOfOrder {
                seq,
                last: self.last_seq,
            });
        }
        self.last_seq = Some(seq);
        match event {
            EpisodeEvent::RunStarted {
                workflow_id,
                version,
                input,
                parent,
                tools,
                verifiers,
                subworkflows,
                trace,
                ..
            } => {
                self.trace = trace.clone();
                self.subworkflows = subworkflows.clone();
                self.workflow_id = Some(workflow_id.clone());
                self.version = Some(*version);
                self.input = input.clone();
                self.parent = parent.clone();
                self.tools = tools.clone();
                self.verifiers = verifiers.clone();
                self.status = Some(RunStatus::Running);
                self.started_at = at;
            }
            EpisodeEvent::StepStarted {
                step,
                iteration,
                owner,
                ..
            } => {
                self.spent.step_executions += 1;
                let s = self.step_mut(step);
                s.status = StepStatus::Running;
                s.owner = owner.clone();
                s.iteration = *iteration;
                s.started_at = at;
                s.attempt = 0;
                s.failure = None;
                s.current = AttemptRecord::default();
                s.condition = None;
                s.forked = false;
                s.joined = None;
                s.finish_order.clear();
                s.child = None;
                s.judgment = None;
            }
            EpisodeEvent::AttemptStarted { step, attempt, .. } => {
                let s = self.step_mut(step);
                s.attempt = *attempt;
                s.current = AttemptRecord::default();
                s.condition = None;
                s.forked = false;
                s.joined = None;
                s.finish_order.clear();
                s.child = None;
                s.judgment = None;
            }
            EpisodeEvent::ModelCalled {
                step,
                text,
                usage,
                provider,
                model,
                prompt,
                ..
            } => {
                self.charge(*usage);
                let current = &mut self.step_mut(step).current;
                current.model = Some(Ok(text.clone()));
                current.model_tokens = Some(usage.total());
                current.action = Some(format!("model:{provider}/{model}"));
                current.input_hash = Some(prompt.clone());
            }
            EpisodeEvent::ModelFailed {
                step,
                failure,
                provider,
                ..
            } => {
                let current = &mut self.step_mut(step).current;
                current.model = Some(Err(failure.clone()));
                current.action = Some(format!("model:{provider}"));
            }
            EpisodeEvent::ToolCalled {
                step,
                outcome,
                reconciled,
                tool,
                args_hash,
                ..
            } => {
                if !reconciled {
                    self.spent.tool_calls += 1;
                }
                let current = &mut self.step_mut(step).current;
                current.tool = Some(outcome.clone());
                current.action = Some(format!(
                    "tool:{}@{} {}",
                    tool.name, tool.version, tool.digest
                ));
                current.input_hash = Some(args_hash.clone());
            }
            EpisodeEvent::Verified { step, verdicts, .. } => {
                self.step_mut(step).current.verdicts = Some(verdicts.clone());
            }
            EpisodeEvent::AttemptFinished { step, failure, .. } => {
                self.step_mut(step).current.finished = Some(failure.clone());
            }
            EpisodeEvent::StepFinished {
                step,
                status,
                output,
                failure,
                ..
            } => {
                let s = self.step_mut(step);
                s.status = *status;
                if output.is_some() {
                    s.output = output.clone();
                }
                s.failure = failure.clone();
                let owner = s.owner.clone();
                match owner {
                    // An owned step finishing is recorded on its owner, whose
                    // join (decided on resume) depends on the order.
                    Some(owner) => self.step_mut(&owner).finish_order.push(step.clone()),
                    None if *status == StepStatus::Completed => {
                        self.completed_order.retain(|s| s != step);
                        self.completed_order.push(step.clone());
                    }
                    None => {}
                }
            }
            EpisodeEvent::StateWritten { key, value, .. } => {
                self.state.insert(key.clone(), value.clone());
            }
            EpisodeEvent::ConditionEvaluated { step, chosen, .. } => {
                self.step_mut(step).condition = Some(chosen.clone());
            }
            EpisodeEvent::BranchesForked { step, .. } => {
                let s = self.step_mut(step);
                s.forked = true;
                s.finish_order.clear();
            }
            EpisodeEvent::BranchesJoined {
                step,
                winners,
                losers,
                failed,
                failure,
                ..
            } => {
                self.step_mut(step).joined = Some(Join {
                    winners: winners.clone(),
                    losers: losers.clone(),
                    failed: failed.clone(),
                    failure: failure.clone(),
                });
            }
            EpisodeEvent::LoopIterated { from, body, .. } => {
                *self.loops.entry(from.clone()).or_default() += 1;
                for b in body {
                    self.step_mut(b).status = StepStatus::Pending;
                }
                self.completed_order.retain(|s| !body.contains(s));
            }
            EpisodeEvent::ModelRequested {
                step, request_hash, ..
            } => {
                self.step_mut(step).current.model_request = Some(request_hash.clone());
            }
            EpisodeEvent::ChildRunRequested {
                step,
                child_run,
                child_version,
                ..
            } => {
                self.step_mut(step).current.child_request =
                    Some((child_run.clone(), *child_version));
            }
            EpisodeEvent::RubricScored { step, verdict, .. } => match step {
                Some(step) => self.step_mut(step).current.rubric = Some(verdict.clone()),
                None => self.rubric = Some(verdict.clone()),
            },
            EpisodeEvent::ChildRunLinked {
                step,
                child_run,
                child_version,
                ..
            } => {
                self.step_mut(step).child = Some(ChildLink {
                    run: child_run.clone(),
                    version: *child_version,
                    finished: None,
                });
            }
            EpisodeEvent::ChildRunFinished {
                step,
                status,
                output,
                ..
            } => {
                if let Some(c) = self.step_mut(step).child.as_mut() {
                    c.finished = Some((*status, output.clone()));
                }
            }
            EpisodeEvent::JudgmentRequested {
                step,
                request_id,
                request_hash,
                expires_at,
                ..
            } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Waiting;
                let expired = s.judgment.as_ref().map_or(0, |j| j.expired);
                s.judgment = Some(JudgmentState {
                    request_id: request_id.clone(),
                    request_hash: request_hash.clone(),
                    result: None,
                    expires_at: *expires_at,
                    expired,
                });
            }
            EpisodeEvent::JudgmentExpired { step, .. } => {
                if let Some(j) = self.step_mut(step).judgment.as_mut() {
                    j.expired += 1;
                    j.expires_at = None;
                }
            }
            EpisodeEvent::JudgmentReceived { step, result, .. } => {
                let s = self.step_mut(step);
                s.status = StepStatus::Running;
                if let Some(j) = s.judgment.as_mut() {
                    j.result = Some(result.clone());
                }
            }
            EpisodeEvent::RunWaiting { reason } => {
                self.status = Some(RunStatus::WaitingJudgment);
                self.reason = Some(reason.clone());
                self.waiting_since.get_or_insert(at);
            }
            EpisodeEvent::RunBlocked { reason, .. } => {
                self.status = Some(RunStatus::Blocked);
                self.reason = Some(reason.clone());
            }
            EpisodeEvent::Reconciled { step, decision, .. } => {
                let _ = (step, decision);
            }
            EpisodeEvent::RunResumed { .. } => {
                if let Some(since) = self.waiting_since.take() {
                    self.spent.waiting_ms += u64::try_from(at.saturating_sub(since)).unwrap_or(0);
                }
                self.status = Some(RunStatus::Running);
                self.reason = None;
            }
            EpisodeEvent::RunRetried { reset, .. } => {
                for id in reset {
                    let s = self.step_mut(id);
                    s.status = StepStatus::Pending;
                    s.failure = None;
                }
                self.completed_order.retain(|s| !reset.contains(s));
                self.status = Some(RunStatus::Running);
                self.reason = None;
                self.output = None;
            }
            EpisodeEvent::RunCompleted { output, .. } => {
                self.status = Some(RunStatus::Completed);
                self.output = Some(output.clone());
                self.reason = None;
            }
            EpisodeEvent::RunFailed { reason, .. } => {
                self.status = Some(RunStatus::Failed);
                self.reason = Some(reason.clone());
            }
            EpisodeEvent::RunCancelled { reason } => {
                self.status = Some(RunStatus::Cancelled);
                self.reason = Some(reason.clone());
            }
        }
        Ok(())
    }

    fn charge(&mut self, usage: Usage) {
        self.spent.tokens = self.spent.tokens.saturating_add(usage.total());
    }
}

/// A write a reducer cannot combine with a key's current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceError {
    pub reducer: Reducer,
    pub value: JsonType,
    pub write: JsonType,
}

/// Applies a reducer: the new value of a state key given its current value
/// and a write. A type the reducer cannot combine is refused, never
/// silently replaced: `merge` takes an object into an object; `append` and
/// `union` extend a list (by a list's items, or by one item); `null` is the
/// empty value of each.
pub fn reduce(reducer: Reducer, current: &Value, write: &Value) -> Result<Value, ReduceError> {
    let refuse = || ReduceError {
        reducer,
        value: JsonType::of(current),
        write: JsonType::of(write),
    };
    Ok(match reducer {
        Reducer::Overwrite => write.clone(),
        Reducer::Append => {
            let mut list = match current {
                Value::Array(a) => a.clone(),
                Value::Null => Vec::new(),
                _ => return Err(refuse()),
            };
            match write {
                Value::Array(items) => list.extend(items.iter().cloned()),
                item => list.push(item.clone()),
            }
            Value::Array(list)
        }
        Reducer::Merge => {
            let mut obj = match current {
                Value::Object(o) => o.clone(),
                Value::Null => serde_json::Map::new(),
                _ => return Err(refuse()),
            };
            match write {
                Value::Object(w) => {
                    for (k, v) in w {
                        obj.insert(k.clone(), v.clone());
                    }
                    Value::Object(obj)
                }
                _ => return Err(refuse()),
            }
        }
        Reducer::Union => {
            let mut items: Vec<Value> = match current {
                Value::Array(a) => a.clone(),
                Value::Null => Vec::new(),
                _ => return Err(refuse()),
            };
            match write {
                Value::Array(w) => items.extend(w.iter().cloned()),
                item => items.push(item.clone()),
            }
            let mut keyed: Vec<(Vec<u8>, Value)> = items
                .into_iter()
                .map(|v| (crate::hash::canonical_json(&v), v))
                .collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            keyed.dedup_by(|a, b| a.0 == b.0);
            Value::Array(keyed.into_iter().map(|(_, v)| v).collect())
        }
    })
}

/// Rebuilds a run's state from its episode alone.
pub fn refold(episode: &Episode) -> Result<RunState, FoldError> {
    let mut state = RunState::default();
    for r in &episode.events {
        state.apply(r)?;
    }
    Ok(state)
}

/// Why a refold did not reproduce the live state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RefoldMismatch {
    #[error("the episode does not fold: {0}")]
    Fold(#[from] FoldError),
    #[error(
        "refolding the episode gives a different state than the live run: first difference at `{path}`: live {live}, refolded {refolded}"
    )]
    Differs {
        path: String,
        live: String,
        refolded: String,
    },
}

/// Checks that refolding `episode` gives exactly `live`.
pub fn assert_refold_identical(live: &RunState, episode: &Episode) -> Result<(), RefoldMismatch> {
    let folded = refold(episode)?;
    if &folded == live {
        return Ok(());
    }
    // Only to locate the difference in words: a state that cannot be shown
    // as JSON is shown as its debug form.
    let json =
        |s: &RunState| serde_json::to_value(s).unwrap_or_else(|_| Value::String(format!("{s:?}")));
    let (a, b) = (json(live), json(&folded));
    let (path, live, refolded) = first_difference(&a, &b, String::new());
    Err(RefoldMismatch::Differs {
        path,
        live,
        refolded,
    })
}

fn first_difference(a: &Value, b: &Value, path: String) -> (String, String, String) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if va != vb {
                    return first_difference(va, vb, format!("{path}/{k}"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if va != vb {
                    return first_difference(va, vb, format!("{path}/{i}"));
                }
            }
        }
        _ => {}
    }
    (
        if path.is_empty() {
            "/".to_owned()
        } else {
            path
        },
        a.to_string(),
        b.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reducers() {
        let r = |reducer, current: Value, write: Value| reduce(reducer, &current, &write);
        assert_eq!(r(Reducer::Overwrite, json!(1), json!(2)), Ok(json!(2)));
        assert_eq!(r(Reducer::Append, json!([1]), json!(2)), Ok(json!([1, 2])));
        assert_eq!(
            r(Reducer::Append, json!([1]), json!([2, 3])),
            Ok(json!([1, 2, 3]))
        );
        assert_eq!(
            r(Reducer::Merge, json!({"a": 1, "b": 1}), json!({"b": 2})),
            Ok(json!({"a": 1, "b": 2}))
        );
        // Union is order-independent: either order of two writes gives one value.
        let union = |a: &str, b: &str| {
            let first = r(Reducer::Union, json!([]), json!(a)).expect("list");
            r(Reducer::Union, first, json!(b)).expect("list")
        };
        let (ab, ba) = (union("b", "a"), union("a", "b"));
        assert_eq!(ab, ba);
        assert_eq!(r(Reducer::Union, ab.clone(), json!("a")), Ok(ab));
    }

    #[test]
    fn reducers_refuse_what_they_cannot_combine() {
        let refused = |reducer, current: Value, write: Value| {
            reduce(reducer, &current, &write).expect_err("refused")
        };
        let e = refused(Reducer::Merge, json!({"a": 1}), json!("x"));
        assert_eq!((e.value, e.write), (JsonType::Object, JsonType::String));
        let e = refused(Reducer::Merge, json!("x"), json!({"a": 1}));
        assert_eq!((e.value, e.write), (JsonType::String, JsonType::Object));
        let e = refused(Reducer::Append, json!({"a": 1}), json!(1));
        assert_eq!(e.reducer, Reducer::Append);
        refused(Reducer::Union, json!(3), json!(1));
        // `null` is the empty value of every reducer.
        assert_eq!(
            reduce(Reducer::Merge, &json!(null), &json!({"a": 1})),
            Ok(json!({"a": 1}))
        );
        assert_eq!(
            reduce(Reducer::Append, &json!(null), &json!(1)),
            Ok(json!([1]))
        );
    }
}
