//! Creating a run (pinning what it can reach and recording its start),
//! loading a stored run into a driving context, and driving it while it is
//! registered as active. The engine does this for top-level runs; a
//! sub-workflow step does it for its child.

use std::sync::Arc;

use poimen_store::{
    CreateRun, IntentRecord, Lease, LeaseRequest, NewRun, RunId, RunStatus, Store, StoreError,
};
use poimen_workflow::WorkflowId;
use serde_json::Value;

use super::{Batch, CommitError, Driving, RunCtx, RunOutcome, StatusChange};
use crate::effects::Failure;
use crate::episode::{Episode, EpisodeError, EpisodeEvent, ParentLink, Pins};
use crate::hash::canonical_json;
use crate::kernel::Kernel;
use crate::lease::Tenure;
use crate::runnable::Runnable;
use crate::scope::{RunScope, TenantId};
use crate::state::{FoldError, RunState, refold};

/// A run that was started, or found under its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub run: RunId,
    /// True when the idempotency key named an existing run.
    pub existing: bool,
    /// The lease this host holds on the new run (`None` for a queued run,
    /// which any host may claim, and for an existing one).
    pub lease: Option<Lease>,
    /// The context the new run's start was written through, for a driver
    /// that follows: driving it needs nothing read back from the store.
    pub(crate) fresh: Option<Fresh>,
}

/// The driving context of a run just created (see [`Started`]). Equal
/// only to itself: it is a cache of what the store holds, not a value.
#[derive(Clone)]
pub(crate) struct Fresh(pub(crate) Arc<RunCtx>);

impl PartialEq for Fresh {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Fresh {}

impl std::fmt::Debug for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fresh(..)")
    }
}

/// Why a run could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("the input does not match the `inputs` schema of workflow `{workflow}`: {violations}")]
    InvalidInput {
        workflow: WorkflowId,
        violations: crate::schema::Violations,
    },
    #[error("cannot start workflow `{workflow}`: {cause}")]
    Unavailable {
        workflow: WorkflowId,
        cause: Failure,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the run's start does not fold: {0}")]
    Fold(#[from] FoldError),
}

impl From<CommitError> for CreateError {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Store(e) => CreateError::Store(e),
            CommitError::Fold(e) => CreateError::Fold(e),
        }
    }
}

/// Why a stored run could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Undecodable(#[from] EpisodeError),
    #[error("run {run}'s episode does not fold: {cause}")]
    Fold { run: RunId, cause: FoldError },
    #[error("{}", held_message(.run, .holder))]
    Held { run: RunId, holder: Option<Lease> },
}

pub(crate) fn held_message(run: &RunId, holder: &Option<Lease>) -> String {
    match holder {
        Some(h) => format!(
            "run {run} is being driven by host `{}` (lease epoch {}, until {} ms since the epoch); \
             another host takes it over only once that lease expires unrenewed — try again after it",
            h.owner, h.epoch, h.expires_at
        ),
        None => format!(
            "run {run} could not be claimed: no host holds it, so it waits for a slot of its \
             workflow's `concurrency` group (it starts when one of the group's runs ends); try \
             again then"
        ),
    }
}

/// What a new run is.
pub(crate) struct NewRunSpec {
    pub runnable: Arc<Runnable>,
    pub input: Value,
    pub parent: Option<ParentLink>,
    pub idempotency_key: Option<String>,
    /// The run's id when the caller decided it (a child run's, recorded by
    /// its parent before it is created); a fresh one otherwise.
    pub id: Option<RunId>,
    /// What the run pins: a child's come from its parent's start; a
    /// top-level run's from its version.
    pub pins: Option<Pins>,
    /// A child run's is its parent's.
    pub tenant: TenantId,
    /// Whether this host takes the new run's lease to drive it now; if not,
    /// the run is left `queued` for any host to claim.
    pub hold: bool,
    /// A top-level run's concurrency group: a held run of a full group is
    /// left `queued` too, until a slot frees.
    pub admission: Option<poimen_store::AdmissionRequest>,
    /// The starter's trace context, recorded in `run_started`.
    pub trace: Option<crate::kernel::TraceCarrier>,
    /// Only the caller knows of a held run until it stops: its start is
    /// not fsynced (see [`StartOptions::waited`](crate::StartOptions::waited)).
    pub waited: bool,
}

/// Creates a run in `store` and records its start: the input is checked
/// against the workflow's `inputs`, and everything it can reach is pinned
/// (tools and verifiers with digests, sub-workflow versions) in its
/// `run_started` event. Creating a run that exists (the same id, or the
/// same idempotency key and input) returns it — and finishes its start if
/// a host stopped between creating it and recording that.
pub(crate) async fn create(
    kernel: &Arc<Kernel>,
    store: Arc<dyn Store>,
    spec: NewRunSpec,
) -> Result<Started, CreateError> {
    let NewRunSpec {
        runnable,
        input,
        parent,
        idempotency_key,
        id,
        pins,
        tenant,
        hold,
        admission,
        trace,
        waited,
    } = spec;
    let def = &runnable.def;
    if let Some(schema) = &runnable.schemas.inputs {
        schema
            .check(&input)
            .map_err(|violations| CreateError::InvalidInput {
                workflow: def.id.clone(),
                violations,
            })?;
    }
    let pins = pins.unwrap_or_else(|| runnable.pins.clone());
    let now = kernel.clock.now_ms();
    // Runs refer to a stored version; publishing is idempotent. A version
    // new to this store descends from the workflow's latest one there.
    if store.version(&runnable.version).await?.is_none() {
        let parent_version = store
            .latest_version(&def.id)
            .await?
            .map(|r| r.version)
            .filter(|v| *v != runnable.version);
        store
            .publish_version(poimen_store::NewVersion::of(
                def.id.clone(),
                poimen_workflow::canonical::canonical_bytes(def),
                parent_version,
                now,
            ))
            .await?;
    }
    let input_bytes = canonical_json(&input);
    let input_hash = poimen_store::BlobHash::of(&input_bytes);
    let id = id.unwrap_or_else(|| RunId::generate(new_ulid(now)));
    let created = store
        .create_run(NewRun {
            id: id.clone(),
            version: runnable.version,
            input: input_bytes,
            tenant: tenant.0.clone(),
            idempotency_key,
            parent: parent.as_ref().map(|p| (p.run.clone(), p.step.clone())),
            // Held from its creation even when enqueued: a queued run
            // with no start recorded must not be claimed by a serving host
            // (it would find no `run_started`), so the creator holds it
            // until its start is stored, then hands it back.
            lease: Some(LeaseRequest {
                owner: kernel.config.host_id.clone(),
                ttl_ms: kernel.config.lease_ttl_ms,
            }),
            admission,
            created_at: now,
        })
        .await?;
    let (rec, existing) = match created {
        CreateRun::Existing(rec) => (rec, true),
        CreateRun::Created(rec) => (rec, false),
    };
    if existing && !store.events(&rec.id).await?.is_empty() {
        return Ok(Started {
            run: rec.id,
            existing: true,
            lease: None,
            fresh: None,
        });
    }
    let started = EpisodeEvent::RunStarted {
        workflow_id: def.id.clone(),
        version: runnable.version,
        input,
        input_hash: input_hash.to_string(),
        parent,
        tools: pins.tools,
        verifiers: pins.verifiers,
        subworkflows: pins.subworkflows,
        trace,
    };
    // Not held — enqueued, or held and its admission group is full: the
    // start is recorded (pins and all) but the run stays `queued`, held by
    // no one, until a host claims it.
    if !hold || (!existing && rec.lease.is_none()) {
        // The lease this creation took, if it took one (a full admission
        // group gives none): the start is written under it and the run is
        // handed back after, so no host claims it before.
        let created_lease = rec.lease.clone().filter(|_| !existing);
        let (commit, _) = super::store_commit(
            &rec.id,
            created_lease.as_ref().map(poimen_store::Lease::fence),
            0,
            now,
            vec![started],
            Batch::events(Vec::new()).durability(poimen_store::Durability::Sync),
        );
        store.commit(commit).await?;
        if let Some(lease) = created_lease {
            store.release_lease(&lease).await?;
        }
        return Ok(Started {
            run: rec.id,
            existing,
            lease: None,
            fresh: None,
        });
    }
    // A run created here is held from its creation; one that existed
    // without a start (its creator stopped in between) is claimed.
    let lease = match rec.lease.clone().filter(|_| !existing) {
        Some(l) => l,
        None => match store
            .claim_run(
                &rec.id,
                &kernel.config.host_id,
                now,
                kernel.config.lease_ttl_ms,
            )
            .await?
        {
            Some(l) => l,
            None => {
                return Ok(Started {
                    run: rec.id,
                    existing: true,
                    lease: None,
                    fresh: None,
                });
            }
        },
    };
    let ctx = RunCtx::new(
        Driving {
            kernel: kernel.clone(),
            store,
            run: rec.id.clone(),
            runnable: runnable.clone(),
            scope: RunScope::root(tenant, rec.id.to_string()),
            depth: 0,
            tenure: Tenure::new(lease.clone()),
        },
        RunState::default(),
        &[],
    );
    // Durable now, unless only a waiting caller knows of the run: then
    // with the run's next durable commit (the WAL is written in order).
    let durability = if waited {
        poimen_store::Durability::Buffered
    } else {
        poimen_store::Durability::Sync
    };
    ctx.commit(
        Batch::status(vec![started], StatusChange::to(RunStatus::Running)).durability(durability),
    )
    .await?;
    // A child is driven through its root, never from this context.
    let fresh = rec.parent.is_none().then_some(Fresh(ctx));
    Ok(Started {
        run: rec.id,
        existing,
        lease: Some(lease),
        fresh,
    })
}

/// A run's episode as stored.
pub(crate) async fn episode(store: &dyn Store, run: &RunId) -> Result<Episode, LoadError> {
    let stored = store.events(run).await?;
    Ok(Episode::from_stored(run.as_str(), &stored)?)
}

/// A run's state, refolded from its stored episode.
pub(crate) async fn state(store: &dyn Store, run: &RunId) -> Result<RunState, LoadError> {
    refold(&episode(store, run).await?).map_err(|cause| LoadError::Fold {
        run: run.clone(),
        cause,
    })
}

/// Loads a stored run (its refolded state and its intents) into a driving
/// context, under `lease` if this host already holds the run, else under a
/// lease claimed now ([`LoadError::Held`] if another host holds it). A
/// terminal run is loaded without claiming it: nothing more is written to it.
pub(crate) async fn load(
    kernel: &Arc<Kernel>,
    store: Arc<dyn Store>,
    run: &RunId,
    runnable: Arc<Runnable>,
    scope: RunScope,
    depth: u32,
    lease: Option<Lease>,
) -> Result<Arc<RunCtx>, LoadError> {
    let lease = match lease {
        Some(l) => l,
        None => claim(kernel, &*store, run).await?,
    };
    let state = state(&*store, run).await?;
    let intents: Vec<IntentRecord> = store.intents(run).await?;
    Ok(RunCtx::new(
        Driving {
            kernel: kernel.clone(),
            store,
            run: run.clone(),
            runnable,
            scope,
            depth,
            tenure: Tenure::new(lease),
        },
        state,
        &intents,
    ))
}

/// Claims a run for this host to drive it.
async fn claim(kernel: &Kernel, store: &dyn Store, run: &RunId) -> Result<Lease, LoadError> {
    let now = kernel.clock.now_ms();
    let host = &kernel.config.host_id;
    if let Some(lease) = store
        .claim_run(run, host, now, kernel.config.lease_ttl_ms)
        .await?
    {
        return Ok(lease);
    }
    let rec = store.run(run).await?;
    match rec {
        // Terminal: nothing will be written; a fence nobody holds.
        Some(r) if r.status.is_terminal() => Ok(Lease {
            run: run.clone(),
            owner: host.clone(),
            epoch: 0,
            expires_at: now,
        }),
        Some(r) => Err(LoadError::Held {
            run: run.clone(),
            holder: r.lease,
        }),
        None => Err(LoadError::Store(StoreError::NotFound {
            what: format!("run {run}"),
        })),
    }
}

impl RunCtx {
    /// Drives a loaded run, registered as active (cancellable through the
    /// executor) while it is driven.
    pub(crate) async fn drive_registered(self: Arc<Self>) -> RunOutcome {
        let kernel = self.kernel.clone();
        kernel.register(&self.run, self.scope.clone());
        let holding = self
            .tenure
            .hold(&kernel, self.store.clone(), self.scope.clone());
        let outcome = self.clone().resume_and_drive().await;
        holding.release().await;
        kernel.unregister(&self.run, &self.scope);
        outcome
    }

    /// Marks a run claimed from the queue as running (under its lease).
    pub(crate) async fn claimed_from_queue(&self) -> Result<(), CommitError> {
        self.commit(Batch::status(
            Vec::new(),
            StatusChange::to(RunStatus::Running),
        ))
        .await
    }

    async fn resume_and_drive(self: Arc<Self>) -> RunOutcome {
        let snap = self.snapshot().await;
        if snap.status == Some(RunStatus::Running) {
            let in_flight = snap.steps.values().any(|s| {
                matches!(
                    s.status,
                    crate::episode::StepStatus::Running | crate::episode::StepStatus::Waiting
                )
            });
            // The run stopped mid-step with its host: say so in the episode.
            if in_flight
                && let Err(e) = self
                    .record(vec![EpisodeEvent::RunResumed {
                        reason: "recovered: the host stopped while the run was in flight".into(),
                    }])
                    .await
            {
                let mut o = RunOutcome::of(&self.run, Arc::unwrap_or_clone(snap));
                o.reason = Some(format!(
                    "the run could not be resumed, its episode ends where it stopped: {e}"
                ));
                return o;
            }
        }
        self.drive().await
    }
}

/// A ULID for a new run id at `now_ms`: time from the executor's clock,
/// the rest random (ids are volatile: nothing hashes or compares them).
pub(crate) fn new_ulid(now_ms: i64) -> ulid::Ulid {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
    ulid::Ulid::from_datetime(at)
}
