//! A judgment step: open an immutable request (question, sources with
//! hashes, result schema, executor/profile, constraints, request hash) and
//! pause the run until a judge's answer is recorded; then the answer is the
//! step's output.

use poimen_store::{JudgmentId, JudgmentWrite, RunStatus};
use poimen_workflow::{JudgmentStep, StepDef};
use serde_json::json;

use super::render_failure;
use crate::crash::crash_point;
use crate::episode::EpisodeEvent;
use crate::hash::{hash_bytes, hash_json, idempotency_key};
use crate::render::{context, render_text};
use crate::run::attempt::AttemptId;
use crate::run::{Batch, Halt, RunCtx, StatusChange, StepEnd};

impl RunCtx {
    pub(in crate::run) async fn judgment_attempt(
        &self,
        def: &StepDef,
        j: &JudgmentStep,
        at: AttemptId,
    ) -> Result<StepEnd, Halt> {
        let iteration = at.iteration;
        let snap = self.snapshot().await;
        if let Some(state) = snap.steps.get(&def.id).and_then(|s| s.judgment.clone()) {
            return match state.result {
                Some(result) => Ok(StepEnd::Completed(result)),
                None => {
                    self.mark_waiting(format!(
                        "step `{}` waits for judgment {}",
                        def.id, state.request_id
                    ))
                    .await?;
                    Err(Halt::Waiting)
                }
            };
        }
        let ctx = context(&snap);
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
            "executor": j.executor,
            "profile": j.profile,
            "constraints": j.constraints,
        });
        let request_hash = hash_json(&request);
        let request_id = judgment_id(self.run.as_str(), def.id.as_str(), iteration, at.attempt);
        crash_point("before_judgment");
        let reason = format!("step `{}` waits for judgment {request_id}", def.id);
        self.commit(Batch {
            judgments: vec![JudgmentWrite::Open {
                id: request_id.clone(),
                step: def.id.clone(),
                iteration,
                request: request.clone(),
                request_hash: request_hash.clone(),
                at: self.kernel.clock.now_ms(),
            }],
            ..Batch::status(
                vec![
                    EpisodeEvent::JudgmentRequested {
                        step: def.id.clone(),
                        iteration,
                        request_id,
                        request_hash,
                        request,
                    },
                    EpisodeEvent::RunWaiting {
                        reason: reason.clone(),
                    },
                ],
                StatusChange::because(RunStatus::WaitingJudgment, reason),
            )
        })
        .await?;
        crash_point("waiting_judgment");
        Err(Halt::Waiting)
    }
}

/// The id of a judgment request: derived from (run, step, iteration,
/// attempt), so a resumed run re-finds its own request and a retried step
/// opens a new one. (A ULID made of hash bits: it has the id's shape
/// without reading the clock.)
pub fn judgment_id(run: &str, step: &str, iteration: u32, attempt: u32) -> JudgmentId {
    let key = idempotency_key(run, step, iteration);
    let mut h = blake3::Hasher::new();
    h.update(key.as_bytes());
    h.update(&attempt.to_le_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&h.finalize().as_bytes()[..16]);
    JudgmentId::generate(ulid::Ulid::from_bytes(bytes))
}
