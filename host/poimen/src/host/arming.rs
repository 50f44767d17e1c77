//! Arming and retirement: which version of a workflow new runs start on,
//! and what becomes of the live runs of the others when that changes.
//!
//! A workflow id has at most one armed version (the store's `armed`
//! table). `poimen arm ID@VERSION` arms one, `poimen disarm ID` arms none:
//! a disarmed workflow starts no run, whatever the target names. When the
//! armed version changes, every live top-level run of another version of
//! the workflow is retired by its own version's `unload` policy: `cancel`
//! cancels it now (recorded in its episode), `drain` lets it finish — with
//! a `timeout`, the store keeps a deadline after which whichever host
//! drives (or wakes) the run cancels it — and `detach` leaves it running on
//! the version it pinned.

use std::collections::BTreeMap;

use poimen_store::{ArmedRecord, RunId, RunStatus, StoreError};
use poimen_workflow::{UnloadPolicy, WorkflowDef, WorkflowId, WorkflowVersion};
use serde::Serialize;

use super::{Error, Host};

/// What arming (or disarming) a workflow did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Armed {
    pub workflow: WorkflowId,
    /// The version now armed; `None`: the workflow is disarmed.
    pub version: Option<WorkflowVersion>,
    /// What was armed before (`None`: nothing ever was).
    pub previous: Option<ArmedRecord>,
    /// The live runs of other versions, and what became of each.
    pub retired: Vec<Retired>,
}

/// One live run retired by its version's `unload` policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retired {
    pub run: RunId,
    pub version: WorkflowVersion,
    pub action: Retirement,
}

/// What a version's `unload` policy did with one of its live runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Retirement {
    /// Cancelled now (`unload.policy: cancel`), or already over by the time
    /// the cancel landed.
    Cancelled,
    /// Left to finish (`drain`); with a timeout, cancelled if it has not
    /// ended by `deadline` (Unix ms).
    Draining { deadline: Option<i64> },
    /// Left running on its pinned version (`detach`).
    Detached,
}

impl Host {
    /// Arms a version as its workflow's current one: `ID@VERSION` (a full
    /// or abbreviated version, or `latest`), or a version alone. The
    /// version must load on this host (registry and policy) and its
    /// workflow be enabled by the policy. Live runs of the workflow's other
    /// versions are retired by their `unload` policies.
    pub async fn arm(&self, spec: &str) -> Result<Armed, Error> {
        let (version, def) = match spec.split_once('@') {
            Some((id, "latest")) => {
                let (record, def) = self.find_version(spec).await?;
                debug_assert_eq!(record.workflow_id.as_str(), id);
                (record.version, def)
            }
            Some((id, text)) => {
                let (record, def) = self.find_version(text).await?;
                if record.workflow_id.as_str() != id {
                    return Err(Error::BadTarget {
                        given: spec.to_owned(),
                        detail: format!(
                            "version {} is a version of `{}`, not of `{id}`; `poimen versions {id}` lists its versions",
                            record.version, record.workflow_id
                        ),
                    });
                }
                (record.version, def)
            }
            None => {
                let (record, def) = self.find_version(spec).await?;
                (record.version, def)
            }
        };
        let workflow = def.id.clone();
        if let Some(why) = self
            .inner
            .policy
            .runs()
            .workflows
            .refuses(workflow.as_str())
        {
            return Err(Error::NotAllowed {
                workflow: workflow.to_string(),
                why,
            });
        }
        // What is armed must load here: a version this host cannot run is
        // refused now, not at the first start.
        self.validate(&def).await?;
        let previous = self
            .inner
            .store()
            .arm(&workflow, Some(&version), self.inner.clock.now_ms())
            .await?;
        let retired = self.retire(&workflow, Some(version)).await?;
        Ok(Armed {
            workflow,
            version: Some(version),
            previous,
            retired,
        })
    }

    /// Disarms a workflow: no new run of it starts until a version is
    /// armed again. Its live runs are retired by their versions' `unload`
    /// policies.
    pub async fn disarm(&self, workflow: &WorkflowId) -> Result<Armed, Error> {
        // Names a workflow that exists, or says which were meant.
        self.versions(workflow).await?;
        let previous = self
            .inner
            .store()
            .arm(workflow, None, self.inner.clock.now_ms())
            .await?;
        let retired = self.retire(workflow, None).await?;
        Ok(Armed {
            workflow: workflow.clone(),
            version: None,
            previous,
            retired,
        })
    }

    /// What is armed for `workflow` (`None`: never armed nor disarmed).
    pub async fn armed(&self, workflow: &WorkflowId) -> Result<Option<ArmedRecord>, Error> {
        Ok(self.inner.store().armed(workflow).await?)
    }

    /// Whether a new run of `version` (of `workflow`) may start: not when
    /// the workflow is disarmed, and — when the policy allows no custom
    /// definitions — only on the armed version.
    pub(super) async fn check_armed(
        &self,
        workflow: &WorkflowId,
        version: &WorkflowVersion,
    ) -> Result<(), Error> {
        let armed = self.inner.store().armed(workflow).await?;
        if let Some(ArmedRecord { version: None, .. }) = armed {
            return Err(Error::Disarmed {
                workflow: workflow.to_string(),
            });
        }
        let custom = self.inner.policy.runs().workflows.allow_custom_definitions;
        let armed = armed.and_then(|a| a.version);
        if !custom && armed != Some(*version) {
            return Err(Error::NotArmed {
                workflow: workflow.to_string(),
                version: *version,
                armed,
            });
        }
        Ok(())
    }

    /// The armed version of the workflow `id`, for a target that names a
    /// workflow rather than a version: `None` when no workflow has that id.
    pub(super) async fn armed_version_of(
        &self,
        id: &str,
    ) -> Result<Option<WorkflowVersion>, Error> {
        let store = self.inner.store();
        let workflow = WorkflowId::from(id);
        match store.armed(&workflow).await? {
            Some(ArmedRecord {
                version: Some(v), ..
            }) => Ok(Some(v)),
            Some(ArmedRecord { version: None, .. }) => Err(Error::Disarmed {
                workflow: id.to_owned(),
            }),
            None => match store.latest_version(&workflow).await? {
                Some(latest) => Err(Error::NotArmed {
                    workflow: id.to_owned(),
                    version: latest.version,
                    armed: None,
                }),
                None => Ok(None),
            },
        }
    }

    /// Retires the live top-level runs of `workflow` on any version but
    /// `keep`, each by its version's `unload` policy. Child runs end with
    /// their parents; ephemeral runs live in their own process.
    async fn retire(
        &self,
        workflow: &WorkflowId,
        keep: Option<WorkflowVersion>,
    ) -> Result<Vec<Retired>, Error> {
        let store = self.inner.store();
        let live: Vec<_> = store
            .in_flight_runs()
            .await?
            .into_iter()
            .filter(|r| &r.workflow_id == workflow && r.parent.is_none())
            .filter(|r| Some(r.version) != keep)
            .collect();
        let mut defs: BTreeMap<WorkflowVersion, WorkflowDef> = BTreeMap::new();
        for run in &live {
            if let std::collections::btree_map::Entry::Vacant(e) = defs.entry(run.version) {
                e.insert(self.version(&run.version).await?.1);
            }
        }
        let mut deadlines: BTreeMap<WorkflowVersion, Option<i64>> = BTreeMap::new();
        let mut retired = Vec::with_capacity(live.len());
        let now = self.inner.clock.now_ms();
        for run in live {
            let Some(def) = defs.get(&run.version) else {
                continue;
            };
            let action = match def.unload.policy {
                UnloadPolicy::Detach => Retirement::Detached,
                UnloadPolicy::Drain => {
                    let deadline = match deadlines.get(&run.version) {
                        Some(d) => *d,
                        None => {
                            let d = self.drain_deadline(def, &run.version, now).await?;
                            deadlines.insert(run.version, d);
                            d
                        }
                    };
                    if let Some(d) = deadline
                        && matches!(run.status, RunStatus::WaitingJudgment | RunStatus::Blocked)
                        && run.wake_at.is_none_or(|w| w > d)
                    {
                        // A run no host holds is looked at again by then.
                        store.set_wake(&run.id, Some(d)).await?;
                    }
                    Retirement::Draining { deadline }
                }
                UnloadPolicy::Cancel => {
                    let reason = format!(
                        "cancelled: its version {} was unloaded (`unload.policy: cancel`) when {}",
                        run.version,
                        match keep {
                            Some(v) => format!("{v} was armed"),
                            None => format!("`{workflow}` was disarmed"),
                        }
                    );
                    match self.inner.executor().cancel(&run.id, &reason).await {
                        // Ended meanwhile: nothing left to cancel.
                        Ok(_) | Err(poimen_executor::OperatorError::WrongStatus { .. }) => {}
                        Err(poimen_executor::OperatorError::Run(
                            poimen_executor::RunError::Store(StoreError::NotFound { .. }),
                        )) => {}
                        Err(e) => return Err(e.into()),
                    }
                    Retirement::Cancelled
                }
            };
            retired.push(Retired {
                run: run.id,
                version: run.version,
                action,
            });
        }
        Ok(retired)
    }

    /// The deadline a drain with a timeout sets for `version`'s live runs
    /// (kept in the store, never moved later than one already set).
    async fn drain_deadline(
        &self,
        def: &WorkflowDef,
        version: &WorkflowVersion,
        now: i64,
    ) -> Result<Option<i64>, Error> {
        let Some(timeout) = def.unload.timeout else {
            return Ok(None);
        };
        let store = self.inner.store();
        let wanted = now.saturating_add(i64::try_from(timeout.0).unwrap_or(i64::MAX));
        match store.unload_deadline(version).await? {
            Some(set) if set <= wanted => Ok(Some(set)),
            _ => {
                store.set_unload_deadline(version, wanted, now).await?;
                Ok(Some(wanted))
            }
        }
    }
}
