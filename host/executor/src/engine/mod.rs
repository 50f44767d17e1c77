//! The executor: starting, driving, resuming and reading runs. The
//! operator's verbs (`operator.rs`), judges' answers (`judgment.rs`) and
//! concurrency admission (`admission.rs`) live beside it; its errors in
//! `error.rs`.
//!
//! Everything it touches outside memory goes through traits: the `Store`,
//! the `ToolHost`, the `ModelProvider`, the `Clock`, and the
//! [`WorkflowLoader`] that turns a stored version into a [`Runnable`]. How
//! one run is driven is `run`'s business; this module decides which runs to
//! drive, and when.

mod admission;
mod error;
mod judgment;
mod operator;
mod serve;

use std::sync::Arc;

use poimen_store::{IntentRecord, Lease, RunId, RunRecord, RunStatus, Store, StoredEvent};
use serde_json::Value;

pub use error::{JudgmentError, Operation, OperatorError, RunError, StartError};
pub use judgment::JudgmentSubmission;
pub use serve::{ServeOptions, ServeReport};

use crate::effects::{Clock, ModelProvider, ToolHost};
use crate::episode::Episode;
use crate::kernel::{ExecutorConfig, Kernel, MAX_SUBWORKFLOW_DEPTH};
use crate::run::{self, NewRunSpec, RunOutcome, Started};
use crate::runnable::{Runnable, WorkflowLoader};
use crate::scope::{RunScope, TenantId};
use crate::state::RunState;

/// Options of a new run.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// The same (version, input) under this key returns the existing run;
    /// another input under it is refused.
    pub idempotency_key: Option<String>,
    pub tenant: TenantId,
    /// The starter's trace context (see [`ExecutorConfig::trace_parent`](crate::ExecutorConfig::trace_parent)).
    pub trace: Option<crate::kernel::TraceCarrier>,
    /// The caller waits for the run to stop (end, or wait for something)
    /// before it tells anyone of the run: its start is then written
    /// without an fsync and made durable by the run's next durable commit
    /// — its first effect's intent, a wait, or its end — so a run with
    /// nothing in between that must be durable costs one fsync. A crash of
    /// the machine before then loses a run no one has seen: its caller had
    /// no answer, and a retry under the same idempotency key starts it
    /// again. A caller that stops waiting first calls
    /// [`Executor::make_durable`] before it hands out the run's id.
    /// [`Executor::run`] always waits.
    pub waited: bool,
}

/// Runs workflows.
#[derive(Clone)]
pub struct Executor {
    kernel: Arc<Kernel>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("host", &self.kernel.config.host_id)
            .finish()
    }
}

impl Executor {
    /// An executor over a durable store (and an in-memory one for
    /// `durable: false` workflows).
    pub fn new(
        store: Arc<dyn Store>,
        tools: Arc<dyn ToolHost>,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        loader: Arc<dyn WorkflowLoader>,
        config: ExecutorConfig,
    ) -> Executor {
        Executor {
            kernel: Arc::new(Kernel::new(store, tools, models, clock, loader, config)),
        }
    }

    /// An executor whose ephemeral runs (`durable: false`) live in
    /// `ephemeral` instead of a memory store of its own: an embedder that
    /// observes its stores (events, metrics) sees those runs too.
    pub fn with_ephemeral_store(
        store: Arc<dyn Store>,
        ephemeral: Arc<dyn Store>,
        tools: Arc<dyn ToolHost>,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        loader: Arc<dyn WorkflowLoader>,
        config: ExecutorConfig,
    ) -> Executor {
        let mut kernel = Kernel::new(store, tools, models, clock, loader, config);
        kernel.memory = ephemeral;
        Executor {
            kernel: Arc::new(kernel),
        }
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.kernel.store
    }

    /// The step scheduler's counts and state now (workers, queue,
    /// pressure, runs shed).
    pub fn scheduler(&self) -> crate::sched::SchedulerStats {
        self.kernel.sched.stats()
    }

    /// Starts a run and drives it until it ends or must wait.
    pub async fn run(
        &self,
        runnable: Arc<Runnable>,
        input: Value,
        opts: StartOptions,
    ) -> Result<RunOutcome, RunError> {
        let opts = StartOptions {
            waited: true,
            ..opts
        };
        let started = self.create(runnable, input, opts, true).await?;
        self.drive_started(started).await
    }

    /// Makes everything written of `run` so far durable (see
    /// [`StartOptions::waited`]): for a caller about to hand out the id of
    /// a run it started waiting and that has not stopped.
    pub async fn make_durable(&self, run: &RunId) -> Result<(), RunError> {
        let (store, _) = self.locate(run).await?;
        Ok(store.sync().await?)
    }

    /// Drives a run [`Executor::start`] returned: under the lease it was
    /// created with, or — an existing run — by resuming it.
    /// A run that waits for a slot of its admission group
    /// (`concurrency.max_runs`, `on_overflow: queue`) is driven once it has
    /// one.
    pub async fn drive_started(&self, started: Started) -> Result<RunOutcome, RunError> {
        match started.lease {
            Some(lease) => {
                // Just created: driven from the context its start was
                // written through, unless something else wrote since.
                if let Some(fresh) = started.fresh
                    && Self::still_fresh(&fresh, &lease).await?
                {
                    return Ok(fresh.0.drive_registered().await);
                }
                self.drive_root(&started.run, Some(lease)).await
            }
            None => match self.wait_for_slot(&started.run).await? {
                Some(lease) => self.drive_root(&started.run, Some(lease)).await,
                None => self.resume(&started.run).await,
            },
        }
    }

    /// Whether the run `fresh` was created in is as its creation left it:
    /// still running under `lease`, so no operator (a cancel) and no other
    /// host wrote to it since, and the context's state is the store's.
    async fn still_fresh(fresh: &run::Fresh, lease: &Lease) -> Result<bool, RunError> {
        let Some(rec) = fresh.0.store.run(&lease.run).await? else {
            return Ok(false);
        };
        Ok(rec.status == RunStatus::Running
            && rec
                .lease
                .is_some_and(|l| l.owner == lease.owner && l.epoch == lease.epoch))
    }

    /// Creates a run held by this host, without driving it (`resume`
    /// drives it). With an idempotency key that already names a run of the
    /// same version and input, returns that run.
    pub async fn start(
        &self,
        runnable: Arc<Runnable>,
        input: Value,
        opts: StartOptions,
    ) -> Result<Started, StartError> {
        self.create(runnable, input, opts, true).await
    }

    /// Enqueues a run: it is created `queued`, held by no host, and any host
    /// serving the store ([`Executor::serve_once`]) claims and drives it.
    /// Idempotency keys work as for [`Executor::start`].
    pub async fn enqueue(
        &self,
        runnable: Arc<Runnable>,
        input: Value,
        opts: StartOptions,
    ) -> Result<Started, StartError> {
        self.create(runnable, input, opts, false).await
    }

    async fn create(
        &self,
        runnable: Arc<Runnable>,
        input: Value,
        opts: StartOptions,
        hold: bool,
    ) -> Result<Started, StartError> {
        // Under pressure, this host sheds new runs by priority.
        if let Err(r) = self.kernel.sched.admit(runnable.def.priority) {
            tracing::warn!(
                workflow = %runnable.def.id,
                priority = ?runnable.def.priority,
                level = %r.level,
                queued = r.queued,
                "run shed under pressure"
            );
            return Err(StartError::Shed {
                workflow: runnable.def.id.clone(),
                priority: runnable.def.priority,
                level: r.level,
                queued: r.queued,
                workers: r.workers,
            });
        }
        // The run's admission group; `replace` makes room in it first. The
        // store admits or refuses the run as it creates it.
        let admission = admission::admission_of(&runnable.def, &input)?;
        if let Some((a, _)) = &admission {
            self.replace_oldest(&runnable, a, opts.idempotency_key.as_deref())
                .await?;
        }
        // A top-level run lives where its workflow's durability class says.
        let store = self.kernel.store_for(&runnable.def).clone();
        let spec = NewRunSpec {
            runnable,
            input,
            parent: None,
            idempotency_key: opts.idempotency_key,
            id: None,
            pins: None,
            tenant: opts.tenant,
            hold,
            admission: admission.as_ref().map(|(a, _)| a.clone()),
            trace: opts.trace,
            waited: opts.waited,
        };
        let def = spec.runnable.def.clone();
        run::create(&self.kernel, store, spec)
            .await
            .map_err(|e| match (e, admission) {
                (run::CreateError::Store(e), Some((_, key))) => admission::overflow(&def, key, e),
                (e, _) => e.into(),
            })
    }

    /// The store that holds a run, and its record.
    async fn locate(&self, run: &RunId) -> Result<(Arc<dyn Store>, RunRecord), RunError> {
        self.kernel
            .locate(run)
            .await?
            .ok_or_else(|| RunError::UnknownRun(run.clone()))
    }

    /// A run's record.
    pub async fn status(&self, run: &RunId) -> Result<RunRecord, RunError> {
        Ok(self.locate(run).await?.1)
    }

    /// A run's episode.
    pub async fn episode(&self, run: &RunId) -> Result<Episode, RunError> {
        let (store, _) = self.locate(run).await?;
        Ok(run::episode(&*store, run).await?)
    }

    /// A run's stored events with a sequence number of `from` or more.
    pub async fn events_from(&self, run: &RunId, from: u64) -> Result<Vec<StoredEvent>, RunError> {
        let (store, _) = self.locate(run).await?;
        Ok(match from.checked_sub(1) {
            None => store.events(run).await?,
            Some(after) => store.events_after(run, after).await?,
        })
    }

    /// A run's state, refolded from its episode.
    pub async fn state(&self, run: &RunId) -> Result<RunState, RunError> {
        let (store, _) = self.locate(run).await?;
        Ok(run::state(&*store, run).await?)
    }

    /// A run's intent records.
    pub async fn intents(&self, run: &RunId) -> Result<Vec<IntentRecord>, RunError> {
        let (store, _) = self.locate(run).await?;
        Ok(store.intents(run).await?)
    }

    /// Drives a run from where its episode ends: a run that stopped with its
    /// host is recovered; a waiting or blocked run whose cause was not
    /// resolved stays as it is; a finished run is returned as is. A child
    /// run is driven through its top-level ancestor.
    pub async fn resume(&self, run: &RunId) -> Result<RunOutcome, RunError> {
        self.resume_held(run, None).await
    }

    /// [`resume`](Self::resume) under `held`, this host's lease on the
    /// run's root (from [`hold_root`](Self::hold_root)); `None` claims it.
    pub(super) async fn resume_held(
        &self,
        run: &RunId,
        held: Option<Lease>,
    ) -> Result<RunOutcome, RunError> {
        let root = self.root_of(run).await?;
        let outcome = self.drive_root(&root, held).await?;
        if &root == run {
            return Ok(outcome);
        }
        // A child run: report its own state.
        self.recorded_outcome(run).await
    }

    /// Claims the root of `run` for this host before an operator's write
    /// makes the run runnable again (a judgment answered, a call
    /// reconciled), so no serving loop — of this host or another — claims
    /// it between that write and the drive that follows it: two drivers of
    /// one run would fence each other, and the second would find the
    /// first's dispatched call open and block on it. `None` when it cannot
    /// be claimed now (another live host holds it, or it ended): the write
    /// goes on unfenced and the resume claims as before.
    pub(super) async fn hold_root(&self, run: &RunId) -> Result<Option<Lease>, RunError> {
        let root = self.root_of(run).await?;
        let (store, _) = self.locate(&root).await?;
        let k = &self.kernel;
        Ok(store
            .claim_run(
                &root,
                &k.config.host_id,
                k.clock.now_ms(),
                k.config.lease_ttl_ms,
            )
            .await?)
    }

    /// Hands back a lease [`hold_root`](Self::hold_root) took when the
    /// operator's write it was taken for failed; the write's error is what
    /// the caller reports, so a failure to release (the lease then expires)
    /// is only logged.
    pub(super) async fn unhold(&self, held: Option<Lease>) {
        let Some(lease) = held else { return };
        let released = match self.locate(&lease.run).await {
            Ok((store, _)) => store.release_lease(&lease).await.map_err(RunError::from),
            Err(e) => Err(e),
        };
        if let Err(e) = released {
            tracing::warn!(run = %lease.run, "a held lease was not handed back (it expires): {e}");
        }
    }

    /// A run's outcome as its record and episode say.
    async fn recorded_outcome(&self, run: &RunId) -> Result<RunOutcome, RunError> {
        let (store, rec) = self.locate(run).await?;
        let mut outcome = RunOutcome::of(run, run::state(&*store, run).await?);
        outcome.status = rec.status;
        outcome.reason = rec.reason;
        Ok(outcome)
    }

    /// Loads the version a run started on. If this host cannot load it as
    /// it would for a new run (a component the run pinned is gone), it is
    /// loaded against what the run pinned, so only a step that reaches the
    /// missing component fails, naming it.
    async fn runnable_of(
        &self,
        store: &dyn Store,
        rec: &RunRecord,
    ) -> Result<Arc<Runnable>, RunError> {
        let loader = &self.kernel.loader;
        let unavailable = |cause| RunError::Unavailable {
            workflow: rec.workflow_id.clone(),
            cause,
        };
        match loader.load(&rec.version).await {
            Ok(r) => Ok(r),
            Err(refused) => {
                let Ok(state) = run::state(store, &rec.id).await else {
                    return Err(unavailable(refused));
                };
                loader
                    .load_for_run(&rec.version, &state.pins())
                    .await
                    .map_err(unavailable)
            }
        }
    }

    /// The top-level ancestor of a run.
    async fn root_of(&self, run: &RunId) -> Result<RunId, RunError> {
        let mut current = run.clone();
        for _ in 0..=MAX_SUBWORKFLOW_DEPTH {
            let (_, rec) = self.locate(&current).await?;
            match rec.parent {
                Some((parent, _)) => current = parent,
                None => return Ok(current),
            }
        }
        Err(RunError::TooDeep {
            max: MAX_SUBWORKFLOW_DEPTH,
        })
    }

    /// The root scope a top-level run is driven in: its own tenant's.
    fn root_scope(rec: &RunRecord) -> RunScope {
        RunScope::root(TenantId(rec.tenant.clone()), rec.id.to_string())
    }

    /// A driving context over a top-level run's stored state, under `lease`
    /// or one claimed now.
    async fn load(&self, run: &RunId, lease: Option<Lease>) -> Result<Arc<run::RunCtx>, RunError> {
        let (store, rec) = self.locate(run).await?;
        let runnable = self.runnable_of(&*store, &rec).await?;
        let scope = Self::root_scope(&rec);
        Ok(run::load(&self.kernel, store, run, runnable, scope, 0, lease).await?)
    }

    /// Drives a top-level run (claiming it unless `lease` is this host's
    /// lease on it). A queued run becomes running once claimed.
    async fn drive_root(&self, run: &RunId, lease: Option<Lease>) -> Result<RunOutcome, RunError> {
        let (_, rec) = self.locate(run).await?;
        // A waiting run is driven too: one of its timers may have come (an
        // expired judgment request, a passed deadline); if none has, it
        // stays waiting.
        if !matches!(
            rec.status,
            RunStatus::Running | RunStatus::Queued | RunStatus::WaitingJudgment
        ) {
            // Nothing to drive: a lease handed in goes back.
            self.unhold(lease).await;
            return self.recorded_outcome(run).await;
        }
        let ctx = self.load(run, lease).await?;
        if rec.status == RunStatus::Queued {
            ctx.claimed_from_queue().await.map_err(|e| match e {
                run::CommitError::Store(e) => RunError::Store(e),
                run::CommitError::Fold(cause) => RunError::Fold {
                    run: run.clone(),
                    cause,
                },
            })?;
        }
        Ok(ctx.drive_registered().await)
    }
}
