//! The executor's shared parts, handed to every run it drives: the stores,
//! the effect traits (tools, models, clock), the workflow loader, this
//! host's configuration, and the registry of runs being driven (so a cancel
//! reaches the task driving the run).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use poimen_store::{RunId, RunRecord, Store, StoreError};

use crate::effects::{Clock, ModelProvider, ToolHost};
use crate::runnable::WorkflowLoader;
use crate::scope::RunScope;

/// Deepest chain of sub-workflow runs the kernel executes. The validator
/// rejects deeper graphs at load; this is the interpreter's own guard.
pub const MAX_SUBWORKFLOW_DEPTH: u32 = 8;

/// How long a lease lasts unless renewed (30 s): another host may take a
/// run over this long after its driver stopped renewing.
pub const DEFAULT_LEASE_TTL_MS: i64 = 30_000;

/// Configuration of an executor.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// This host's id: the owner named in the leases of the runs it drives.
    /// Hosts sharing a store need distinct ids; processes under one id
    /// fence each other out (the newest claim wins, the older driver stops
    /// at its next write).
    pub host_id: String,
    /// How long a lease lasts from its last renewal, in milliseconds. A
    /// driving host renews every third of it.
    pub lease_ttl_ms: i64,
    /// Whether a workflow that does not say `durable` keeps its runs in the
    /// store (the host policy's `durability.work`; default yes).
    pub durable_by_default: bool,
    /// How long a judgment step without a `timeout` waits (the policy's
    /// `judgment.timeout-ms`; `None`: until answered).
    pub judgment_timeout: Option<std::time::Duration>,
    /// What a judgment step without an `on_timeout` does when it expires
    /// (the policy's `judgment.on-timeout`; `None`: it fails).
    pub judgment_fallback: Option<poimen_workflow::JudgmentFallback>,
    /// Largest output a step or a run may produce, in canonical JSON bytes
    /// (the policy's `bounds.output-bytes`).
    pub output_bytes: Option<u64>,
    /// Step executions at once, and the queue depths at which new runs
    /// are shed.
    pub scheduler: crate::sched::SchedulerConfig,
    /// Continues the trace of whoever started a run, when the run is
    /// driven outside the starter's span (claimed from the queue, taken
    /// over, resumed): given the `run` span and the trace context recorded
    /// in its `run_started`. `None`: a run's span is a child of whatever
    /// span drives it.
    pub trace_parent: Option<TraceParent>,
    /// How much effect-free work a run may hold unwritten before its next
    /// written commit (the policy's `durability.tail-events` and
    /// `durability.tail-ms`; see `Tail` in `run/mod.rs`).
    pub tail: TailBound,
}

pub use crate::episode::TraceCarrier;

/// Makes a run's span continue the trace in a [`TraceCarrier`] (the
/// embedder's tracing bridge does it: this crate only makes spans).
#[derive(Clone)]
pub struct TraceParent(pub Arc<TraceParentFn>);

/// What a [`TraceParent`] calls: the run's span, and the recorded carrier.
pub type TraceParentFn = dyn Fn(&tracing::Span, &TraceCarrier) + Send + Sync;

impl std::fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceParent")
    }
}

impl ExecutorConfig {
    /// The defaults, for the host named `id`.
    pub fn host(id: impl Into<String>) -> ExecutorConfig {
        ExecutorConfig {
            host_id: id.into(),
            ..ExecutorConfig::default()
        }
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            host_id: "local".to_owned(),
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            durable_by_default: true,
            judgment_timeout: None,
            judgment_fallback: None,
            output_bytes: None,
            scheduler: crate::sched::SchedulerConfig::default(),
            trace_parent: None,
            tail: TailBound::DEFAULT,
        }
    }
}

/// How much effect-free work a run may hold unwritten (see `Tail` in `run/mod.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBound {
    /// Events the tail may hold; a commit that would reach this many is
    /// written. `0`: every commit is written (durability at every step).
    pub events: u32,
    /// How old the tail's oldest record may grow, in milliseconds, before
    /// the next commit is written.
    pub ms: u32,
}

impl TailBound {
    /// The default: 512 events or 250 ms, whichever comes first.
    pub const DEFAULT: TailBound = TailBound {
        events: 512,
        ms: 250,
    };
    /// No tail: every commit is written when it is made.
    pub const NONE: TailBound = TailBound { events: 0, ms: 0 };

    /// Whether a tail of `events` events, the oldest applied at `since`,
    /// may still be held at `now`.
    pub(crate) fn holds(self, events: usize, since: Option<i64>, now: i64) -> bool {
        events < self.events as usize
            && since.is_none_or(|t| now.saturating_sub(t) < i64::from(self.ms))
    }
}

impl Default for TailBound {
    fn default() -> Self {
        TailBound::DEFAULT
    }
}

pub(crate) struct Kernel {
    /// Durable runs.
    pub store: Arc<dyn Store>,
    /// Ephemeral runs (`durable: false`).
    pub memory: Arc<dyn Store>,
    pub tools: Arc<dyn ToolHost>,
    pub models: Arc<dyn ModelProvider>,
    pub clock: Arc<dyn Clock>,
    pub loader: Arc<dyn WorkflowLoader>,
    pub config: ExecutorConfig,
    /// Runs this host is driving, with the scope that cancels each.
    active: Mutex<HashMap<RunId, RunScope>>,
    /// Workers for step executions, and the pressure they are under.
    pub sched: Arc<crate::sched::Scheduler>,
}

impl Kernel {
    pub fn new(
        store: Arc<dyn Store>,
        tools: Arc<dyn ToolHost>,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        loader: Arc<dyn WorkflowLoader>,
        config: ExecutorConfig,
    ) -> Kernel {
        Kernel {
            store,
            memory: Arc::new(poimen_store::MemoryStore::new()),
            tools,
            models,
            clock,
            loader,
            sched: Arc::new(crate::sched::Scheduler::new(config.scheduler)),
            config,
            active: Mutex::new(HashMap::new()),
        }
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, RunScope>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a run as driven by this host.
    pub fn register(&self, run: &RunId, scope: RunScope) {
        self.active().insert(run.clone(), scope);
    }

    /// Forgets the drive of `run` whose scope is `scope` — not a later
    /// drive of the same run that registered since (this host claimed it
    /// again after this drive's lease expired).
    pub fn unregister(&self, run: &RunId, scope: &RunScope) {
        let mut active = self.active();
        if active.get(run).is_some_and(|s| s.same_drive(scope)) {
            active.remove(run);
        }
    }

    /// The scope of a run this host is driving.
    pub fn driving(&self, run: &RunId) -> Option<RunScope> {
        self.active().get(run).cloned()
    }

    /// Where a new top-level run of `def` lives: the durable store, or
    /// memory, as the workflow says or, when it does not, this host's
    /// default.
    pub fn store_for(&self, def: &poimen_workflow::WorkflowDef) -> &Arc<dyn Store> {
        if def.durable.unwrap_or(self.config.durable_by_default) {
            &self.store
        } else {
            &self.memory
        }
    }

    /// The store that holds a run, and its record.
    pub async fn locate(
        &self,
        run: &RunId,
    ) -> Result<Option<(Arc<dyn Store>, RunRecord)>, StoreError> {
        for store in [&self.store, &self.memory] {
            if let Some(r) = store.run(run).await? {
                return Ok(Some((store.clone(), r)));
            }
        }
        Ok(None)
    }
}
