//! A model step: render the prompt (and system prompt) from recorded state,
//! ask the model (once — the answer is recorded and replayed), parse the
//! answer as the step's format asks.

use poimen_store::BlobHash;
use poimen_workflow::{ModelStep, OutputFormat, StepDef};
use serde_json::Value;

use super::render_failure;
use crate::crash::crash_point;
use crate::effects::{Contract, Failure, FailureClass, ModelRequest};
use crate::episode::EpisodeEvent;
use crate::hash::hash_json;
use crate::render::{render_text, template_context};
use crate::run::attempt::AttemptId;
use crate::run::{Batch, Halt, RunCtx, StepEnd};
use crate::scope::RunScope;

impl RunCtx {
    pub(in crate::run) async fn model_attempt(
        &self,
        def: &StepDef,
        m: &ModelStep,
        at: AttemptId,
        defer_answer: bool,
        scope: &RunScope,
    ) -> Result<(Value, StepEnd), Halt> {
        let snap = self.snapshot().await;
        let ctx = template_context(&snap);
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
        let current = snap
            .steps
            .get(&def.id)
            .filter(|s| s.iteration == at.iteration && s.attempt == at.attempt)
            .map(|s| s.current.clone())
            .unwrap_or_default();
        let (text, tokens) = match current.model {
            Some(Ok(text)) => (text, current.model_tokens),
            Some(Err(failure)) => return Ok((input, StepEnd::Failed(failure))),
            None => {
                let provider = self.kernel.models.clone();
                let tools = def
                    .tools
                    .0
                    .iter()
                    .filter_map(|r| snap.tools.get(&r.to_string()).map(|p| p.identity.clone()))
                    .collect();
                let request = ModelRequest {
                    system: system.clone(),
                    prompt: prompt.clone(),
                    model: m.model.clone(),
                    effort: m.effort,
                    json: m.format == OutputFormat::Json,
                    schema: m.schema.clone(),
                    tools,
                    max_tokens: self.runnable.def.limits.tokens,
                    timeout: def.effective_timeout().as_duration(),
                };
                // The model-call intent: the whole request is durable before
                // the provider is asked. A request recorded without its
                // answer was asked and lost when a host stopped: ask again,
                // and say so.
                let identity = request.identity(provider.provider(), provider.default_model());
                let request_hash = hash_json(&identity);
                let mut blobs = vec![prompt.clone().into_bytes()];
                if let Some(s) = &system {
                    blobs.push(s.clone().into_bytes());
                }
                self.commit(Batch {
                    blobs,
                    ..Batch::intents(
                        vec![EpisodeEvent::ModelRequested {
                            step: def.id.clone(),
                            iteration: at.iteration,
                            attempt: at.attempt,
                            request: identity,
                            request_hash: request_hash.clone(),
                            default_model: provider.default_model().to_owned(),
                            reask: current.model_request.is_some(),
                        }],
                        Vec::new(),
                    )
                })
                .await?;
                crash_point("after_model_requested");
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
                crash_point("before_model_committed");
                match answer {
                    Ok(resp) => {
                        // The answer is durable before it is used: after a
                        // crash it is reused, never asked for again.
                        let output_blob = BlobHash::of(resp.text.as_bytes());
                        let called = EpisodeEvent::ModelCalled {
                            step: def.id.clone(),
                            iteration: at.iteration,
                            attempt: at.attempt,
                            provider: provider.provider().to_owned(),
                            model: resp.model.clone(),
                            prompt: BlobHash::of(prompt.as_bytes()).to_string(),
                            system: system
                                .as_ref()
                                .map(|s| BlobHash::of(s.as_bytes()).to_string()),
                            partition,
                            output: output_blob.to_string(),
                            text: resp.text.clone(),
                            usage: resp.usage,
                            latency_ms,
                            request_hash: Some(request_hash),
                        };
                        let blobs = vec![resp.text.clone().into_bytes()];
                        if defer_answer {
                            // Durable with the step's end, which follows
                            // at once and is the first to use it; a crash
                            // before it asks again (a re-ask).
                            self.defer_outcome(
                                vec![called],
                                Vec::new(),
                                blobs,
                                true,
                                "after_model_committed",
                            );
                        } else {
                            self.commit(Batch {
                                blobs,
                                ..Batch::intents(vec![called], Vec::new())
                            })
                            .await?;
                            crash_point("after_model_committed");
                        }
                        (resp.text, Some(resp.usage.total()))
                    }
                    Err(failure) => {
                        self.commit(Batch::intents(
                            vec![EpisodeEvent::ModelFailed {
                                step: def.id.clone(),
                                iteration: at.iteration,
                                attempt: at.attempt,
                                provider: provider.provider().to_owned(),
                                failure: failure.clone(),
                            }],
                            Vec::new(),
                        ))
                        .await?;
                        return Ok((input, StepEnd::Failed(failure)));
                    }
                }
            }
        };
        // `limits.tokens` bounds one call, as its provider counted it (the
        // request asked for at most that many; a provider may not hold to it).
        if let (Some(limit), Some(used)) = (self.runnable.def.limits.tokens, tokens)
            && used > limit
        {
            return Ok((
                input,
                StepEnd::Failed(Failure::new(
                    FailureClass::Failed,
                    format!(
                        "the model call used {used} tokens, over the workflow's `limits.tokens` of {limit}"
                    ),
                )),
            ));
        }
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
        // The answer's contract is checked before it is anyone's output.
        if let Some(schema) = self.runnable.schemas.model.get(&def.id)
            && let Err(v) = schema.check(&output)
        {
            return Ok((
                input,
                StepEnd::Failed(Failure::contract(Contract::ModelOutput { violations: v.0 })),
            ));
        }
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
