//! A model step: render the prompt (and system prompt) from recorded state,
//! ask the model (once — the answer is recorded and replayed), parse the
//! answer as the step's format asks.

use poimen_store::BlobHash;
use poimen_workflow::{ModelStep, OutputFormat, StepDef};
use serde_json::Value;

use super::render_failure;
use crate::effects::{Failure, FailureClass, ModelRequest};
use crate::episode::EpisodeEvent;
use crate::render::{context, render_text};
use crate::run::attempt::AttemptId;
use crate::run::{Batch, Halt, RunCtx, StepEnd};
use crate::scope::RunScope;

impl RunCtx {
    pub(in crate::run) async fn model_attempt(
        &self,
        def: &StepDef,
        m: &ModelStep,
        at: AttemptId,
        scope: &RunScope,
    ) -> Result<(Value, StepEnd), Halt> {
        let snap = self.snapshot().await;
        let ctx = context(&snap);
        let (prompt, mut partition) = match render_text(&m.prompt.0, &ctx) {
            Ok(p) => p,
            Err(e) => return Ok((Value::Null, StepEnd::Failed(render_failure(e)))),
        };
        let system = match &m.system {
            Some(s) => match render_text(&s.0, &ctx) {
                Ok((text, p)) => {
                    partition.extend(p);
                    Some(text)
                }
                Err(e) => return Ok((Value::Null, StepEnd::Failed(render_failure(e)))),
            },
            None => None,
        };
        partition.sort();
        partition.dedup();
        let input = Value::String(prompt.clone());
        let recorded = snap
            .steps
            .get(&def.id)
            .and_then(|s| s.current.model.clone());
        let text = match recorded {
            Some(Ok(text)) => text,
            Some(Err(failure)) => return Ok((input, StepEnd::Failed(failure))),
            None => {
                let provider = self.kernel.models.clone();
                let request = ModelRequest {
                    system: system.clone(),
                    prompt: prompt.clone(),
                    model: m.model.clone(),
                    effort: m.effort,
                    json: m.format == OutputFormat::Json,
                    max_tokens: self.runnable.def.limits.tokens,
                    timeout: def.effective_timeout().as_duration(),
                };
                let started = self.kernel.clock.now_ms();
                let timeout = request.timeout;
                let answer = match scope
                    .guard(tokio::time::timeout(timeout, provider.complete(request)))
                    .await
                {
                    Ok(a) => a,
                    Err(stop) => return Ok((input, stop.into())),
                };
                let latency_ms =
                    u64::try_from(self.kernel.clock.now_ms().saturating_sub(started)).unwrap_or(0);
                let answer = answer.unwrap_or_else(|_| {
                    Err(Failure::new(
                        FailureClass::Timeout,
                        format!(
                            "model `{}` did not answer within {} ms",
                            provider.provider(),
                            timeout.as_millis()
                        ),
                    ))
                });
                match answer {
                    Ok(resp) => {
                        // Prompt and output are content-addressed blobs, written
                        // in the same commit as the event that names them.
                        let mut blobs =
                            vec![prompt.clone().into_bytes(), resp.text.clone().into_bytes()];
                        let prompt_blob = BlobHash::of(prompt.as_bytes());
                        let output_blob = BlobHash::of(resp.text.as_bytes());
                        let system_blob = system.as_ref().map(|s| {
                            blobs.push(s.clone().into_bytes());
                            BlobHash::of(s.as_bytes()).to_string()
                        });
                        self.commit(Batch {
                            events: vec![EpisodeEvent::ModelCalled {
                                step: def.id.clone(),
                                iteration: at.iteration,
                                attempt: at.attempt,
                                provider: provider.provider().to_owned(),
                                model: resp.model.clone(),
                                prompt: prompt_blob.to_string(),
                                system: system_blob,
                                partition,
                                output: output_blob.to_string(),
                                text: resp.text.clone(),
                                usage: resp.usage,
                                latency_ms,
                            }],
                            blobs,
                            ..Batch::default()
                        })
                        .await?;
                        resp.text
                    }
                    Err(failure) => {
                        self.record(vec![EpisodeEvent::ModelFailed {
                            step: def.id.clone(),
                            iteration: at.iteration,
                            attempt: at.attempt,
                            provider: provider.provider().to_owned(),
                            failure: failure.clone(),
                        }])
                        .await?;
                        return Ok((input, StepEnd::Failed(failure)));
                    }
                }
            }
        };
        let output = match m.format {
            OutputFormat::Text => Value::String(text),
            OutputFormat::Json => match serde_json::from_str::<Value>(strip_fences(&text)) {
                Ok(v) => v,
                Err(e) => {
                    return Ok((
                        input,
                        StepEnd::Failed(Failure::new(
                            FailureClass::Failed,
                            format!(
                                "the model's answer is not the JSON the step asks for ({e}): {}",
                                preview(&text)
                            ),
                        )),
                    ));
                }
            },
        };
        Ok((input, StepEnd::Completed(output)))
    }
}

fn strip_fences(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn preview(text: &str) -> String {
    let mut s: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        s.push('…');
    }
    s
}
