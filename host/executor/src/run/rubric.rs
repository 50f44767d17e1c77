//! Rubrics, scored live: each criterion's verifier scores an output (a
//! step's attempt, or the run's result), the weighted score `Σ wᵢ·sᵢ / Σ wᵢ`
//! is compared with the rubric's threshold — or, without one, every
//! criterion must pass — and the verdict is recorded before it decides.

use poimen_workflow::RubricDef;
use serde_json::Value;

use super::{Halt, Inconsistency, RunCtx};
use crate::effects::VerifierCall;
use crate::episode::{CriterionVerdict, RubricVerdict, VerdictOutcome};
use crate::scope::{RunScope, Stop};

/// How scoring a rubric ended.
#[derive(Debug)]
pub(super) enum Scored {
    /// Every criterion was scored: the verdict, to record.
    Verdict(RubricVerdict),
    /// The scope was stopped (cancelled, timed out) while verifiers ran.
    Stopped(Stop),
}

impl RunCtx {
    /// Scores `output` (produced from `input`) by `rubric`'s criteria,
    /// their verifiers fanned out under `scope` and joined.
    pub(super) async fn score_rubric(
        &self,
        rubric: &RubricDef,
        input: &Value,
        output: &Value,
        timeout: std::time::Duration,
        scope: &RunScope,
    ) -> Result<Scored, Halt> {
        let snap = self.snapshot().await;
        let mut calls = Vec::new();
        for c in &rubric.criteria {
            let Some(identity) = snap.verifiers.get(&c.verifier.to_string()).cloned() else {
                return Err(Inconsistency::NotPinned {
                    what: "rubric verifier",
                    name: c.verifier.to_string(),
                    step: poimen_workflow::StepId::from(c.name.as_str()),
                }
                .into());
            };
            let call = VerifierCall {
                verifier: identity.clone(),
                input: input.clone(),
                output: output.clone(),
                config: c.config.clone(),
                timeout,
            };
            let tools = self.kernel.tools.clone();
            let (name, weight) = (c.name.clone(), c.weight);
            calls.push(async move {
                let r = tools.verify(call).await;
                CriterionVerdict {
                    criterion: name,
                    weight,
                    verifier: identity,
                    outcome: match r.outcome {
                        Ok(v) => VerdictOutcome::Verdict(v),
                        Err(failure) => VerdictOutcome::Err { failure },
                    },
                    record: r.record,
                }
            });
        }
        let criteria = match scope.guard(futures::future::join_all(calls)).await {
            Ok(c) => c,
            Err(stop) => return Ok(Scored::Stopped(stop)),
        };
        Ok(Scored::Verdict(verdict(criteria, rubric.threshold)))
    }
}

/// The verdict of scored criteria under `threshold`.
pub(crate) fn verdict(criteria: Vec<CriterionVerdict>, threshold: Option<f64>) -> RubricVerdict {
    let score_of = |c: &CriterionVerdict| match &c.outcome {
        VerdictOutcome::Verdict(v) => v.score.clamp(0.0, 1.0),
        VerdictOutcome::Err { .. } => 0.0,
    };
    let total: f64 = criteria.iter().map(|c| c.weight).sum();
    let score = if total > 0.0 {
        criteria.iter().map(|c| c.weight * score_of(c)).sum::<f64>() / total
    } else {
        0.0
    };
    let passed = match threshold {
        Some(t) => score >= t,
        None => criteria
            .iter()
            .all(|c| matches!(&c.outcome, VerdictOutcome::Verdict(v) if v.pass)),
    };
    RubricVerdict {
        criteria,
        score,
        threshold,
        passed,
    }
}

/// Why a rubric's verdict failed, in words.
pub(crate) fn rejection(v: &RubricVerdict) -> String {
    let failing: Vec<String> = v
        .criteria
        .iter()
        .filter(|c| !matches!(&c.outcome, VerdictOutcome::Verdict(x) if x.pass))
        .map(|c| match &c.outcome {
            VerdictOutcome::Verdict(x) => {
                format!("`{}` scored {:.2}: {}", c.criterion, x.score, x.reason)
            }
            VerdictOutcome::Err { failure } => {
                format!("`{}` could not score: {failure}", c.criterion)
            }
        })
        .collect();
    match v.threshold {
        Some(t) => format!(
            "the rubric scored {:.3}, below its threshold {t}{}",
            v.score,
            if failing.is_empty() {
                String::new()
            } else {
                format!(" ({})", failing.join("; "))
            }
        ),
        None => format!(
            "the rubric needs every criterion to pass: {}",
            failing.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effects::{ToolIdentity, Verdict};

    fn c(name: &str, weight: f64, pass: bool, score: f64) -> CriterionVerdict {
        CriterionVerdict {
            criterion: name.into(),
            weight,
            verifier: ToolIdentity {
                name: "v".into(),
                version: "1.0.0".into(),
                digest: "b3:00".into(),
            },
            outcome: VerdictOutcome::Verdict(Verdict {
                pass,
                score,
                reason: "r".into(),
            }),
            record: Value::Null,
        }
    }

    #[test]
    fn weighted_score_against_the_threshold_or_every_criterion() {
        let v = verdict(
            vec![c("a", 3.0, true, 1.0), c("b", 1.0, false, 0.2)],
            Some(0.7),
        );
        assert!((v.score - 0.8).abs() < 1e-9);
        assert!(v.passed, "0.8 reaches 0.7");
        let v = verdict(vec![c("a", 1.0, true, 0.5)], Some(0.7));
        assert!(!v.passed, "0.5 is below 0.7");
        assert!(rejection(&v).contains("below its threshold 0.7"));
        let v = verdict(vec![c("a", 1.0, true, 1.0), c("b", 1.0, false, 0.9)], None);
        assert!(!v.passed, "without a threshold every criterion must pass");
        assert!(rejection(&v).contains("`b` scored 0.90"));
    }
}
