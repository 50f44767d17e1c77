//! A judge's way back into a waiting run: the answer is validated against
//! its request (hash, result schema, executor/profile, provenance) before it
//! is recorded; any mismatch is a specific error and the run stays waiting.

use std::sync::Arc;

use poimen_store::{JudgmentId, JudgmentRecord, JudgmentStatus, JudgmentWrite, RunStatus, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Executor, JudgmentError};
use crate::episode::EpisodeEvent;
use crate::hash::hash_json;
use crate::run::{self, Batch, RunOutcome, StatusChange};

/// A judge's answer to a judgment request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgmentSubmission {
    /// The hash of the request the judge answered.
    pub request_hash: String,
    pub result: Value,
    #[serde(default)]
    pub executor: Option<String>,
    #[serde(default)]
    pub profile: Option<String>,
    /// Who judged, how, from what (`judge` is required).
    pub provenance: Value,
}

impl Executor {
    /// Validates a judge's answer and, when it holds, records it and resumes
    /// the run.
    pub async fn submit_judgment(
        &self,
        id: &str,
        submission: JudgmentSubmission,
    ) -> Result<RunOutcome, JudgmentError> {
        let (store, record) = self
            .find_judgment(id)
            .await?
            .ok_or_else(|| JudgmentError::Unknown(id.to_owned()))?;
        if record.status != JudgmentStatus::Open {
            return Err(JudgmentError::Closed { id: id.to_owned() });
        }
        if submission.request_hash != record.request_hash {
            return Err(JudgmentError::RequestHashMismatch {
                id: id.to_owned(),
                expected: record.request_hash.clone(),
                got: submission.request_hash.clone(),
            });
        }
        let schema = record
            .request
            .get("result_schema")
            .cloned()
            .unwrap_or(Value::Bool(true));
        crate::schema::check(&schema, &submission.result).map_err(|violations| {
            JudgmentError::ResultSchema {
                id: id.to_owned(),
                violations,
            }
        })?;
        for (field, expected, got) in [
            (
                "executor",
                record.request.get("executor"),
                &submission.executor,
            ),
            (
                "profile",
                record.request.get("profile"),
                &submission.profile,
            ),
        ] {
            if let Some(Value::String(expected)) = expected
                && got.as_deref() != Some(expected.as_str())
            {
                return Err(JudgmentError::ExecutorMismatch {
                    id: id.to_owned(),
                    field,
                    expected: expected.clone(),
                    got: got.clone().unwrap_or_else(|| "(none)".into()),
                });
            }
        }
        if !matches!(submission.provenance.get("judge"), Some(Value::String(j)) if !j.trim().is_empty())
        {
            return Err(JudgmentError::Provenance { id: id.to_owned() });
        }
        let run = record.run.clone();
        let state = run::state(&*store, &run).await?;
        let now = self.kernel.clock.now_ms();
        let batch = Batch {
            judgments: vec![JudgmentWrite::Answer {
                id: record.id.clone(),
                result: submission.result.clone(),
                at: now,
            }],
            ..Batch::status(
                vec![
                    EpisodeEvent::JudgmentReceived {
                        step: record.step.clone(),
                        iteration: record.iteration,
                        request_id: record.id.clone(),
                        result_hash: hash_json(&submission.result),
                        result: submission.result,
                        provenance: serde_json::json!({
                            "judge": submission.provenance,
                            "executor": submission.executor,
                            "profile": submission.profile,
                        }),
                    },
                    EpisodeEvent::RunResumed {
                        reason: format!("judgment {id} answered"),
                    },
                ],
                StatusChange::to(RunStatus::Running),
            )
        };
        let held = self.hold_root(&run).await?;
        let written = async {
            self.append(&*store, &run, &state, batch).await?;
            self.unblock_ancestors(
                &run,
                RunStatus::WaitingJudgment,
                "a child run's judgment was answered",
            )
            .await
        }
        .await;
        if let Err(e) = written {
            self.unhold(held).await;
            return Err(e.into());
        }
        Ok(self.resume_held(&run, held).await?)
    }

    /// Open judgment requests of both stores.
    pub async fn open_judgments(&self) -> Result<Vec<JudgmentRecord>, JudgmentError> {
        let mut all = self.kernel.store.open_judgments().await?;
        all.extend(self.kernel.memory.open_judgments().await?);
        Ok(all)
    }

    /// One judgment request.
    pub async fn judgment(&self, id: &str) -> Result<JudgmentRecord, JudgmentError> {
        self.find_judgment(id)
            .await?
            .map(|(_, r)| r)
            .ok_or_else(|| JudgmentError::Unknown(id.to_owned()))
    }

    async fn find_judgment(
        &self,
        id: &str,
    ) -> Result<Option<(Arc<dyn Store>, JudgmentRecord)>, JudgmentError> {
        let Ok(id) = JudgmentId::parse(id) else {
            return Ok(None);
        };
        for store in [&self.kernel.store, &self.kernel.memory] {
            if let Some(j) = store.judgment(&id).await? {
                return Ok(Some((store.clone(), j)));
            }
        }
        Ok(None)
    }
}
