//! Concurrency admission: a workflow's `concurrency` applied when a
//! top-level run starts — counting its active runs in the stores (so the
//! count survives restarts), then queueing, refusing or replacing.

use poimen_store::{RunFilter, RunRecord};
use poimen_workflow::{ConcurrencyScope, Overflow, WorkflowDef};
use serde_json::Value;

use super::{Executor, StartError};
use crate::runnable::Runnable;

/// How often a queued start looks for a free slot again.
const QUEUE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The rendered `key` of a run of `def` on `input`.
fn render_key(def: &WorkflowDef, input: &Value) -> Result<String, StartError> {
    let Some(template) = &def.key else {
        return Err(StartError::NoKeyTemplate {
            workflow: def.id.clone(),
        });
    };
    let ctx = serde_json::json!({ "inputs": input });
    crate::render::render_text(&template.0, &ctx)
        .map(|(text, _)| text)
        .map_err(|cause| StartError::Key {
            workflow: def.id.clone(),
            cause,
        })
}

impl Executor {
    /// Applies the workflow's `concurrency` to a new top-level run: counts
    /// the active (not final) runs in its scope — all runs of the workflow,
    /// or those whose rendered `key` equals this input's — in the stores;
    /// then queues, refuses or replaces. Returns the admission guard, to
    /// hold until the run is created.
    pub(super) async fn admit(
        &self,
        runnable: &Runnable,
        input: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, StartError> {
        let def = &runnable.def;
        let Some(max) = def.concurrency.max_runs else {
            return Ok(None);
        };
        let key = match def.concurrency.scope {
            ConcurrencyScope::Workflow => None,
            ConcurrencyScope::Key => Some(render_key(def, input)?),
        };
        let lock = self
            .admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(def.id.to_string())
            .or_default()
            .clone();
        let guard = lock.lock_owned().await;
        loop {
            let mut active: Vec<RunRecord> = Vec::new();
            for store in [&self.kernel.store, &self.kernel.memory] {
                let runs = store
                    .list_runs(RunFilter {
                        workflow_id: Some(def.id.clone()),
                        ..RunFilter::default()
                    })
                    .await?;
                for r in runs {
                    // A retried request under its idempotency key is not a
                    // new run: `create` returns (or refuses) the existing one.
                    if idempotency_key.is_some() && r.idempotency_key.as_deref() == idempotency_key
                    {
                        return Ok(Some(guard));
                    }
                    if r.parent.is_some() || r.status.is_terminal() {
                        continue;
                    }
                    if let Some(k) = &key {
                        let theirs = match store.blob(&r.input_hash).await? {
                            Some(bytes) => serde_json::from_slice::<Value>(&bytes)
                                .ok()
                                .and_then(|v| render_key(def, &v).ok()),
                            None => None,
                        };
                        if theirs.as_ref() != Some(k) {
                            continue;
                        }
                    }
                    active.push(r);
                }
            }
            if active.len() < max as usize {
                return Ok(Some(guard));
            }
            active.sort_by(|a, b| {
                a.created_at
                    .cmp(&b.created_at)
                    .then_with(|| a.id.as_str().cmp(b.id.as_str()))
            });
            match def.concurrency.on_overflow {
                Overflow::Drop => {
                    return Err(StartError::Overflow {
                        workflow: def.id.clone(),
                        key,
                        max_runs: max,
                        active: active.into_iter().map(|r| r.id).collect(),
                    });
                }
                Overflow::Replace => {
                    let excess = active.len() + 1 - max as usize;
                    for r in active.iter().take(excess) {
                        self.cancel(
                            &r.id,
                            "replaced by a newer run (concurrency.on_overflow: replace)",
                        )
                        .await
                        .map_err(|e| StartError::Replace(Box::new(e)))?;
                    }
                }
                Overflow::Queue => {
                    self.kernel.clock.sleep(QUEUE_POLL).await;
                }
            }
        }
    }
}
