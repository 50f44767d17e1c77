//! A judgment step: open an immutable request (question, sources with
//! hashes, result schema, executor/profile, constraints, request hash) and
//! pause the run until a judge's answer is recorded; then the answer is the
//! step's output. A request with a timeout (the step's, or the policy's)
//! expires unanswered when it passes, and the step's `on_timeout` decides:
//! fail, take a default answer, or ask again of another executor or
//! profile, once. The run's timer in the store makes whichever host serves
//! it look at the run when the request expires.

use poimen_store::{JudgmentId, JudgmentWrite, RunStatus};
use poimen_workflow::{JudgmentFallback, JudgmentStep, StepDef};
use serde_json::json;

use super::render_failure;
use crate::crash::crash_point;
use crate::effects::{Failure, FailureClass};
use crate::episode::EpisodeEvent;
use crate::hash::{hash_bytes, hash_json, idempotency_key};
use crate::render::{render_text, template_context};
use crate::run::attempt::AttemptId;
use crate::run::{Batch, Halt, RunCtx, StatusChange, StepEnd};
use crate::state::JudgmentState;

impl RunCtx {
    pub(in crate::run) async fn judgment_attempt(
        &self,
        def: &StepDef,
        j: &JudgmentStep,
        at: AttemptId,
    ) -> Result<StepEnd, Halt> {
        let snap = self.snapshot().await;
        if let Some(state) = snap.steps.get(&def.id).and_then(|s| s.judgment.clone()) {
            if let Some(result) = state.result {
                return Ok(StepEnd::Completed(result));
            }
            if state
                .expires_at
                .is_some_and(|exp| self.kernel.clock.now_ms() >= exp)
            {
                return self.judgment_expired(def, j, at, &state).await;
            }
            self.mark_waiting(format!(
                "step `{}` waits for judgment {}",
                def.id, state.request_id
            ))
            .await?;
            return Err(Halt::Waiting);
        }
        self.open_judgment(def, j, at, (j.executor.clone(), j.profile.clone()), 0)
            .await
    }

    /// How long the step's requests wait for an answer: its `timeout`, or
    /// the policy's; `None`: until answered.
    fn judgment_timeout(&self, def: &StepDef) -> Option<u64> {
        def.timeout.map(|t| t.0).or_else(|| {
            self.kernel
                .config
                .judgment_timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
        })
    }

    /// Opens a request (`escalation` 0: the step's own; 1: asked again of
    /// another executor or profile) and halts the run waiting for it.
    async fn open_judgment(
        &self,
        def: &StepDef,
        j: &JudgmentStep,
        at: AttemptId,
        (executor, profile): (Option<String>, Option<String>),
        escalation: u32,
    ) -> Result<StepEnd, Halt> {
        let iteration = at.iteration;
        let snap = self.snapshot().await;
        let ctx = template_context(&snap);
        let question = match render_text(&j.question.0, &ctx) {
            Ok((q, _)) => q,
            Err(e) => return Ok(StepEnd::Failed(render_failure(e))),
        };
        let mut sources = Vec::new();
        for s in &j.sources {
            match render_text(&s.0, &ctx) {
                Ok((text, _)) => {
                    sources.push(json!({"hash": hash_bytes(text.as_bytes()), "text": text}))
                }
                Err(e) => return Ok(StepEnd::Failed(render_failure(e))),
            }
        }
        // The request is what the judge sees and must answer — and only
        // that: its hash names the question, not the run, workflow or
        // version asking it, so a recorded answer stays valid for any
        // version that asks the same thing (shadow evaluation replays by it).
        let request = json!({
            "step": def.id,
            "question": question,
            "sources": sources,
            "result_schema": j.result_schema,
            "executor": executor,
            "profile": profile,
            "constraints": j.constraints,
        });
        let request_hash = hash_json(&request);
        let request_id = judgment_id_escalated(
            self.run.as_str(),
            def.id.as_str(),
            iteration,
            at.attempt,
            escalation,
        );
        let now = self.kernel.clock.now_ms();
        let expires_at = self
            .judgment_timeout(def)
            .map(|t| now.saturating_add(i64::try_from(t).unwrap_or(i64::MAX)));
        crash_point("before_judgment");
        let reason = format!("step `{}` waits for judgment {request_id}", def.id);
        // A child run's timers are its root's (set when the root halts).
        let wake = (self.depth == 0)
            .then(|| self.next_timer(&snap, expires_at))
            .flatten();
        self.commit(Batch {
            judgments: vec![JudgmentWrite::Open {
                id: request_id.clone(),
                step: def.id.clone(),
                iteration,
                request: request.clone(),
                request_hash: request_hash.clone(),
                at: now,
            }],
            ..Batch::status(
                vec![
                    EpisodeEvent::JudgmentRequested {
                        step: def.id.clone(),
                        iteration,
                        request_id,
                        request_hash,
                        request,
                        expires_at,
                    },
                    EpisodeEvent::RunWaiting {
                        reason: reason.clone(),
                    },
                ],
                StatusChange::because(RunStatus::WaitingJudgment, reason).waking(wake),
            )
        })
        .await?;
        crash_point("waiting_judgment");
        Err(Halt::Waiting)
    }

    /// The open request's timeout passed: what the step's `on_timeout`
    /// (or the policy's; by default `fail`) says. An escalated request that
    /// expires too fails the step.
    async fn judgment_expired(
        &self,
        def: &StepDef,
        j: &JudgmentStep,
        at: AttemptId,
        state: &JudgmentState,
    ) -> Result<StepEnd, Halt> {
        let fallback = match (state.expired, &j.on_timeout) {
            (0, Some(f)) => f.clone(),
            (0, None) => self
                .kernel
                .config
                .judgment_fallback
                .clone()
                .unwrap_or(JudgmentFallback::Fail),
            _ => JudgmentFallback::Fail,
        };
        let now = self.kernel.clock.now_ms();
        let id = state.request_id.clone();
        let expired = |fallback: &str| EpisodeEvent::JudgmentExpired {
            step: def.id.clone(),
            iteration: at.iteration,
            request_id: id.clone(),
            fallback: fallback.to_owned(),
        };
        let resumed = EpisodeEvent::RunResumed {
            reason: format!("judgment {id} expired unanswered"),
        };
        match fallback {
            JudgmentFallback::Fail => {
                self.commit(Batch {
                    judgments: vec![JudgmentWrite::Expire {
                        id: id.clone(),
                        at: now,
                    }],
                    ..Batch::status(
                        vec![expired("fail"), resumed],
                        StatusChange::to(RunStatus::Running),
                    )
                })
                .await?;
                let waited = self.judgment_timeout(def).unwrap_or(0);
                Ok(StepEnd::Failed(Failure::new(
                    FailureClass::Timeout,
                    format!("judgment {id} got no answer within {waited} ms"),
                )))
            }
            JudgmentFallback::Answer(answer) => {
                self.commit(Batch {
                    judgments: vec![JudgmentWrite::Answer {
                        id: id.clone(),
                        result: answer.clone(),
                        at: now,
                    }],
                    ..Batch::status(
                        vec![
                            expired("answer"),
                            EpisodeEvent::JudgmentReceived {
                                step: def.id.clone(),
                                iteration: at.iteration,
                                request_id: id.clone(),
                                result_hash: hash_json(&answer),
                                result: answer.clone(),
                                provenance: json!({"fallback": "on_timeout"}),
                            },
                            resumed,
                        ],
                        StatusChange::to(RunStatus::Running),
                    )
                })
                .await?;
                Ok(StepEnd::Completed(answer))
            }
            JudgmentFallback::Escalate { executor, profile } => {
                self.commit(Batch {
                    judgments: vec![JudgmentWrite::Expire {
                        id: id.clone(),
                        at: now,
                    }],
                    ..Batch::events(vec![expired("escalate")])
                        .durability(poimen_store::Durability::Sync)
                })
                .await?;
                let to = (
                    executor.or_else(|| j.executor.clone()),
                    profile.or_else(|| j.profile.clone()),
                );
                self.open_judgment(def, j, at, to, 1).await
            }
        }
    }
}

/// The id of a judgment request: derived from (run, step, iteration,
/// attempt), so a resumed run re-finds its own request and a retried step
/// opens a new one. (A ULID made of hash bits: it has the id's shape
/// without reading the clock.)
pub fn judgment_id(run: &str, step: &str, iteration: u32, attempt: u32) -> JudgmentId {
    judgment_id_escalated(run, step, iteration, attempt, 0)
}

/// [`judgment_id`] of the request asked again after the first expired
/// (`escalation` 1); `escalation` 0 is the step's own request.
fn judgment_id_escalated(
    run: &str,
    step: &str,
    iteration: u32,
    attempt: u32,
    escalation: u32,
) -> JudgmentId {
    let key = idempotency_key(run, step, iteration);
    let mut h = blake3::Hasher::new();
    h.update(key.as_bytes());
    h.update(&attempt.to_le_bytes());
    if escalation > 0 {
        h.update(b"escalation");
        h.update(&escalation.to_le_bytes());
    }
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&h.finalize().as_bytes()[..16]);
    JudgmentId::generate(ulid::Ulid::from_bytes(bytes))
}
