//! The host policy's rules for workflows, checked where a workflow is
//! loaded: what the validator cannot know because it depends on this
//! host's policy file (seed 003: the one policy authority) — bounds on
//! retries, which judgment executors and profiles may be asked, whether a
//! workflow may change the world at all.
//!
//! Each broken rule is a [`PolicyViolation`] naming the step, the value and
//! the policy key; all of them are reported at once, like the validator's
//! errors. Which workflows may *start* (enabled ids, custom definitions) is
//! decided where runs start (`host.rs`); this module only reads a validated
//! definition.

use poimen_sandbox::policy::RunPolicy;
use poimen_workflow::{Capability, EffectClass, JudgmentFallback, StepId, StepKind, Validated};

/// A workflow that breaks a rule of the host's policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyViolation {
    #[error(
        "step `{step}` allows {attempts} attempts; the policy's `[bounds] max-attempts` is {limit}"
    )]
    TooManyAttempts {
        step: StepId,
        attempts: u32,
        limit: u32,
    },
    #[error(
        "step `{step}` may back off up to {backoff_ms} ms between attempts; the policy's `[bounds] max-backoff-ms` is {limit_ms}: set `retry.max_backoff` within it"
    )]
    BackoffTooLong {
        step: StepId,
        backoff_ms: u64,
        limit_ms: u64,
    },
    #[error(
        "judgment step `{step}` asks executor `{executor}`, which the policy's `[judgment] executors` does not list ({allowed})"
    )]
    ExecutorNotAllowed {
        step: StepId,
        executor: String,
        allowed: String,
    },
    #[error(
        "judgment step `{step}` asks profile `{profile}`, which the policy's `[judgment] profiles` does not list ({allowed})"
    )]
    ProfileNotAllowed {
        step: StepId,
        profile: String,
        allowed: String,
    },
    #[error(
        "judgment step `{step}` would take the policy's `[judgment] on-timeout` answer, which does not match its result schema: {violations}; give the step an `on_timeout` of its own"
    )]
    DefaultAnswerViolatesSchema { step: StepId, violations: String },
    #[error(
        "step `{step}` can change the world ({why}), and the policy's `[workflows] allow-state-mutations` is false"
    )]
    StateMutation { step: StepId, why: String },
}

/// Every rule of `runs` that the validated workflow `v` (and each
/// sub-workflow it reaches) breaks.
pub fn violations(v: &Validated, runs: &RunPolicy) -> Vec<PolicyViolation> {
    let mut out = Vec::new();
    check(v, runs, &mut out);
    for child in v.sub_workflows().values() {
        for e in violations(child, runs) {
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

fn listed(set: &std::collections::BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(", ")
}

fn check(v: &Validated, runs: &RunPolicy, out: &mut Vec<PolicyViolation>) {
    let bounds = &runs.bounds;
    let judgment = &runs.judgment;
    for s in &v.def().steps {
        let retry = &s.retry;
        if let Some(limit) = bounds.max_attempts
            && retry.max_attempts > limit
        {
            out.push(PolicyViolation::TooManyAttempts {
                step: s.id.clone(),
                attempts: retry.max_attempts,
                limit,
            });
        }
        if let Some(limit) = bounds.max_backoff {
            let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
            // The longest wait between attempts the policy allows the step.
            let longest = (2..=retry.max_attempts.max(1))
                .map(|a| retry.delay_before(a).0)
                .max()
                .unwrap_or(0);
            if longest > limit_ms {
                out.push(PolicyViolation::BackoffTooLong {
                    step: s.id.clone(),
                    backoff_ms: longest,
                    limit_ms,
                });
            }
        }
        match &s.kind {
            StepKind::Judgment(j) => {
                let escalated = match &j.on_timeout {
                    Some(JudgmentFallback::Escalate { executor, profile }) => {
                        (executor.as_ref(), profile.as_ref())
                    }
                    _ => (None, None),
                };
                if let Some(allowed) = &judgment.executors {
                    for e in [j.executor.as_ref(), escalated.0].into_iter().flatten() {
                        if !allowed.contains(e) {
                            out.push(PolicyViolation::ExecutorNotAllowed {
                                step: s.id.clone(),
                                executor: e.clone(),
                                allowed: listed(allowed),
                            });
                        }
                    }
                }
                if let Some(allowed) = &judgment.profiles {
                    for p in [j.profile.as_ref(), escalated.1].into_iter().flatten() {
                        if !allowed.contains(p) {
                            out.push(PolicyViolation::ProfileNotAllowed {
                                step: s.id.clone(),
                                profile: p.clone(),
                                allowed: listed(allowed),
                            });
                        }
                    }
                }
                if j.on_timeout.is_none()
                    && let Some(JudgmentFallback::Answer(answer)) = &judgment.on_timeout
                    && let Err(broken) = poimen_executor::schema::check(&j.result_schema, answer)
                {
                    out.push(PolicyViolation::DefaultAnswerViolatesSchema {
                        step: s.id.clone(),
                        violations: broken.to_string(),
                    });
                }
            }
            StepKind::Tool(t) if !runs.workflows.allow_state_mutations => {
                if let Some(info) = v.tool(&t.tool) {
                    let writes = info
                        .capabilities
                        .iter()
                        .any(|c| matches!(c, Capability::FilesystemWrite { .. }));
                    let why = match (info.effect, writes) {
                        (EffectClass::NonIdempotent, _) => {
                            Some(format!("`{}` is non-idempotent", info.name))
                        }
                        (EffectClass::Idempotent, _) => {
                            Some(format!("`{}` has an (idempotent) effect", info.name))
                        }
                        (EffectClass::Pure, true) => {
                            Some(format!("`{}` is granted a writable mount", info.name))
                        }
                        (EffectClass::Pure, false) => None,
                    };
                    if let Some(why) = why {
                        out.push(PolicyViolation::StateMutation {
                            step: s.id.clone(),
                            why,
                        });
                    }
                }
            }
            _ => {}
        }
    }
}
