//! Concurrency admission: a workflow's `concurrency` applied to its
//! top-level runs. The store holds it — each run is created in an admission
//! group (the workflow, or the workflow and the run's rendered `key`) with
//! the group's `max_runs`, and a host claims a run of a full group only
//! when one of its runs ends — so it is exact across every host of the
//! store, survives restarts, and a full group never holds back another.
//! Here: the group of a new run, the refusal (`on_overflow: drop`, decided
//! by the store as it creates the run), the replacement (`replace`: the
//! oldest runs of the group are cancelled first) and the wait of a run
//! started in-process for its slot.

use poimen_store::{AdmissionRequest, Lease, RunFilter, RunId, RunRecord, RunStatus, StoreError};
use poimen_workflow::{ConcurrencyScope, Overflow, WorkflowDef};
use serde_json::Value;

use super::{Executor, RunError, StartError};
use crate::runnable::Runnable;

/// How often a run started in-process looks for a free slot again.
const QUEUE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The rendered `key` of a run of `def` on `input`.
fn render_key(def: &WorkflowDef, input: &Value) -> Result<String, StartError> {
    let Some(template) = &def.key else {
        return Err(StartError::NoKeyTemplate {
            workflow: def.id.clone(),
        });
    };
    let ctx = crate::render::json_context(&serde_json::json!({ "inputs": input }));
    crate::render::render_text(&template.0, &ctx)
        .map(|(text, _)| text)
        .map_err(|cause| StartError::Key {
            workflow: def.id.clone(),
            cause,
        })
}

/// A new top-level run's admission: its group, the group's limit, and
/// whether a full group refuses it. The key (for `scope: key`) is returned
/// too, for errors.
pub(super) fn admission_of(
    def: &WorkflowDef,
    input: &Value,
) -> Result<Option<(AdmissionRequest, Option<String>)>, StartError> {
    let Some(max) = def.concurrency.max_runs else {
        return Ok(None);
    };
    let key = match def.concurrency.scope {
        ConcurrencyScope::Workflow => None,
        ConcurrencyScope::Key => Some(render_key(def, input)?),
    };
    let group = match &key {
        None => def.id.to_string(),
        Some(k) => format!("{}\u{1f}key={k}", def.id),
    };
    Ok(Some((
        AdmissionRequest {
            group,
            max_runs: max,
            refuse_when_full: def.concurrency.on_overflow == Overflow::Drop,
        },
        key,
    )))
}

/// The refusal of the store, as the starter hears it.
pub(super) fn overflow(def: &WorkflowDef, key: Option<String>, e: StoreError) -> StartError {
    match e {
        StoreError::AdmissionFull {
            max_runs, active, ..
        } => StartError::Overflow {
            workflow: def.id.clone(),
            key,
            max_runs,
            active,
        },
        e => e.into(),
    }
}

impl Executor {
    /// `on_overflow: replace`: makes room for one more run in the group by
    /// cancelling its oldest runs not yet ended.
    pub(super) async fn replace_oldest(
        &self,
        runnable: &Runnable,
        admission: &AdmissionRequest,
        idempotency_key: Option<&str>,
    ) -> Result<(), StartError> {
        if runnable.def.concurrency.on_overflow != Overflow::Replace {
            return Ok(());
        }
        let store = self.kernel.store_for(&runnable.def);
        let runs = store
            .list_runs(RunFilter {
                workflow_id: Some(runnable.def.id.clone()),
                ..RunFilter::default()
            })
            .await?;
        // A retried request under its idempotency key is not a new run.
        if idempotency_key.is_some()
            && runs
                .iter()
                .any(|r| r.idempotency_key.as_deref() == idempotency_key)
        {
            return Ok(());
        }
        let mut active: Vec<RunRecord> = runs
            .into_iter()
            .filter(|r| {
                !r.status.is_terminal()
                    && r.admission.as_ref().map(|a| a.group.as_str()) == Some(&admission.group)
            })
            .collect();
        if active.len() < admission.max_runs as usize {
            return Ok(());
        }
        active.sort_by(|a, b| (a.created_at, a.id.as_str()).cmp(&(b.created_at, b.id.as_str())));
        let excess = active.len() + 1 - admission.max_runs as usize;
        for r in active.iter().take(excess) {
            self.cancel(
                &r.id,
                "replaced by a newer run (concurrency.on_overflow: replace)",
            )
            .await
            .map_err(|e| StartError::Replace(Box::new(e)))?;
        }
        Ok(())
    }

    /// Waits until a run created queued in a full admission group gets a
    /// slot, and claims it for this host. `None`: it is no longer waiting
    /// for one here (another host claimed it, or it ended).
    pub(super) async fn wait_for_slot(&self, run: &RunId) -> Result<Option<Lease>, RunError> {
        loop {
            let (store, rec) = self.locate(run).await?;
            let waiting = rec.status == RunStatus::Queued
                && rec.admission.is_some()
                && !rec.admitted
                && rec.lease.is_none();
            if !waiting {
                return Ok(None);
            }
            let now = self.kernel.clock.now_ms();
            let ttl = self.kernel.config.lease_ttl_ms;
            if let Some(lease) = store
                .claim_run(run, &self.kernel.config.host_id, now, ttl)
                .await?
            {
                return Ok(Some(lease));
            }
            self.kernel.clock.sleep(QUEUE_POLL).await;
        }
    }
}
