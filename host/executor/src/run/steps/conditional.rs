//! A conditional step: evaluate its predicate over recorded state (once —
//! the choice is recorded and replayed), skip the other arm, run the chosen
//! one.

use std::sync::Arc;

use poimen_workflow::{ConditionalStep, StepDef};
use serde_json::Value;

use super::render_failure;
use crate::effects::Failure;
use crate::episode::{EpisodeEvent, StepStatus};
use crate::render::{context, eval_predicate};
use crate::run::{Halt, RunCtx, StepEnd};
use crate::scope::RunScope;

impl RunCtx {
    pub(in crate::run) async fn conditional_attempt(
        self: Arc<Self>,
        def: &StepDef,
        c: &ConditionalStep,
        iteration: u32,
        scope: &RunScope,
    ) -> Result<StepEnd, Halt> {
        let snap = self.snapshot().await;
        let chosen = match snap.steps.get(&def.id).and_then(|s| s.condition.clone()) {
            Some(chosen) => chosen,
            None => {
                let result = match eval_predicate(&c.on.0, &context(&snap)) {
                    Ok(b) => b,
                    Err(e) => return Ok(StepEnd::Failed(render_failure(e))),
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
                self.record(events).await?;
                chosen
            }
        };
        let Some(target) = chosen else {
            return Ok(StepEnd::Completed(Value::Null));
        };
        Ok(
            match self
                .clone()
                .exec_step(target.clone(), Some(def.id.clone()), scope.clone())
                .await?
            {
                StepEnd::Failed(f) => {
                    StepEnd::Failed(Failure::new(f.class, format!("`{target}`: {}", f.message)))
                }
                // The target recorded its own end; this step halts with the
                // run, without an end of its own.
                StepEnd::Cancelled => return Err(Halt::Cancelled),
                other => other,
            },
        )
    }
}
