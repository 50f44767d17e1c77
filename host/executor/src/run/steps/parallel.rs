//! A parallel step: fork the branches inside the run's scope (each its own
//! cancellable branch scope), join them by the step's policy, cancel the
//! losers once the join is decided, and apply the winners' state writes in
//! branch order.

use std::collections::BTreeMap;
use std::sync::Arc;

use poimen_workflow::{JoinPolicy, ParallelStep, StepDef, StepId, StepKind};
use serde_json::Value;

use crate::effects::{Failure, FailureClass};
use crate::episode::{EpisodeEvent, StepStatus};
use crate::run::{Halt, Inconsistency, LANE, Lane, RunCtx, StepEnd};
use crate::scope::RunScope;
use crate::state::{Join, RunState};

/// How many branches must succeed.
fn needed(p: &ParallelStep) -> usize {
    match p.join {
        JoinPolicy::All => p.branches.len(),
        JoinPolicy::Any => 1,
        JoinPolicy::Quorum(n) => n as usize,
    }
}

impl RunCtx {
    pub(in crate::run) async fn parallel_attempt(
        self: Arc<Self>,
        def: &StepDef,
        p: &ParallelStep,
        iteration: u32,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        let branches = &p.branches;
        let snap = self.snapshot().await;
        let me = snap.steps.get(&def.id).cloned().unwrap_or_default();
        if let Some(j) = &me.joined {
            return Ok(self.join_result(def, j, &snap).into());
        }
        if !me.forked {
            self.record(vec![EpisodeEvent::BranchesForked {
                step: def.id.clone(),
                iteration,
                branches: branches.to_vec(),
                join: p.join,
            }])
            .await?;
        }
        let needed = needed(p);
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
                // Each branch task is a lane of its own: what its steps
                // queue rides only with its own next commit (see
                // `Deferred`), never with a sibling's.
                let lane = Lane::Branch(b.clone());
                set.spawn(LANE.scope(lane, async move {
                    let r = ctx
                        .clone()
                        .exec_step(b.clone(), Some(owner), branch_scope)
                        .await;
                    // A branch that halted may leave records queued: its
                    // own lane's last commit carries them.
                    let r = match ctx.flush_queued().await {
                        Ok(()) => r,
                        Err(e) => r.and(Err(e.into())),
                    };
                    (b, r)
                }));
            }
        }
        let mut halt: Option<Halt> = None;
        while let Some(joined) = set.join_next().await {
            let (b, r) = match joined {
                Ok(x) => x,
                Err(e) => {
                    halt.get_or_insert(Halt::Inconsistent(Inconsistency::BranchDied {
                        step: def.id.clone(),
                        cause: e.to_string(),
                    }));
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
                Ok(StepEnd::Cancelled) | Err(_) => {
                    let h = match r {
                        Err(h) => h,
                        _ => Halt::Cancelled,
                    };
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
            if !decided || !matches!(h, Halt::Waiting | Halt::Blocked) {
                return Err(h);
            }
        }
        if let Some(stop) = scope.stopped() {
            return Ok(stop.into());
        }
        // Record the join, winners in branch declaration order.
        let snap = self.snapshot().await;
        let in_order = |set: &[StepId]| -> Vec<StepId> {
            branches
                .iter()
                .filter(|b| set.contains(b))
                .cloned()
                .collect()
        };
        let winners = in_order(&winners);
        let failed = in_order(&failed);
        let losers: Vec<StepId> = branches
            .iter()
            .filter(|b| !winners.contains(b) && !failed.contains(b))
            .cloned()
            .collect();
        // Winners' state writes, applied in branch order and checked
        // against their keys' contracts before the join is recorded.
        let mut writes = Vec::new();
        let mut failure = None;
        if winners.len() >= needed {
            let mut state = snap.state.clone();
            for w in &winners {
                let (Some(key), Some(out)) = (
                    self.runnable.step(w).and_then(|d| d.writes.as_ref()),
                    snap.steps.get(w).and_then(|s| s.output.as_ref()),
                ) else {
                    continue;
                };
                match self.reduced(key.as_str(), state.get(key.as_str()), out) {
                    Ok(ev) => {
                        if let EpisodeEvent::StateWritten { value, .. } = &ev {
                            state.insert(key.0.clone(), value.clone());
                        }
                        writes.push(ev);
                    }
                    Err(mut f) => {
                        f.message = format!("branch `{w}`: {}", f.message);
                        failure = Some(f);
                        writes.clear();
                        break;
                    }
                }
            }
        }
        let mut events = vec![EpisodeEvent::BranchesJoined {
            step: def.id.clone(),
            iteration,
            winners: winners.clone(),
            losers,
            failed,
            failure,
        }];
        events.extend(writes);
        self.record(events).await?;
        let snap = self.snapshot().await;
        match snap.steps.get(&def.id).and_then(|s| s.joined.clone()) {
            Some(j) => Ok(self.join_result(def, &j, &snap).into()),
            None => Err(Inconsistency::JoinNotRecorded(def.id.clone()).into()),
        }
    }

    fn join_result(&self, def: &StepDef, j: &Join, snap: &RunState) -> Result<Value, Failure> {
        if let Some(f) = &j.failure {
            return Err(f.clone());
        }
        let needed = match &def.kind {
            StepKind::Parallel(p) => needed(p),
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
}
