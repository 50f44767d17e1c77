//! `poimen::Host`: the embedding API. One value that loads, validates,
//! publishes, plans and runs workflows, and gives operators and judges their
//! ways back into stopped runs — what the CLI and the MCP server are built on.
//!
//! It wires the crates together (store, sandbox, executor, model provider)
//! and translates their errors into one typed [`Error`]. It exposes no
//! wasmtime, SQLite or tokio-internal types.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use poimen_executor::{
    Clock, JudgmentSubmission, ModelProvider, Reconciliation, RunState, StartOptions, SystemClock,
};
use poimen_sandbox::policy::Policy;
use poimen_sandbox::{CallLimits, Invocation};
use poimen_store::{
    JudgmentId, JudgmentRecord, MemoryStore, RunFilter, RunId, RunRecord, SqliteStore, Store,
    StoreError, VersionRecord, WorkflowSummary,
};
use poimen_workflow::{
    EligibilityReport, Format, StepId, StepKind, ToolRef, Validated, VersionPrefix, WorkflowDef,
    WorkflowId, WorkflowVersion,
};
use serde::Serialize;
use serde_json::Value;

use crate::audit::Audit;
use crate::builder::PluginSource;
pub use crate::error::Error;
use crate::events::{EventFilter, HostEvent, Hub, Observed, RunEvent};
use crate::loader::check;
use crate::wiring::Wiring;

mod arming;
mod handle;
use handle::Driven;
pub use handle::RunHandle;
mod retention;
pub use arming::{Armed, Retired, Retirement};

pub use poimen_executor::model::{EffortMode, OpenAiConfig, Rule};
pub use poimen_executor::{Episode, RunOutcome};
pub use poimen_store::RunStatus;

/// Largest workflow file read from disk (the front end has its own bound too).
pub const MAX_WORKFLOW_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Where runs and versions are kept.
#[derive(Debug, Clone)]
enum StoreChoice {
    Sqlite(PathBuf),
    /// A store named by URL (`postgres://…`, `sqlite://PATH`, or a path).
    Url(String),
    /// A store the embedder opened.
    Given(Arc<dyn Store>),
    Memory,
}

/// Who answers model steps.
#[derive(Debug, Clone, Default)]
pub enum ModelChoice {
    /// No model: model steps fail as unavailable, naming the fix.
    #[default]
    None,
    /// The deterministic scripted model.
    Scripted(Vec<Rule>),
    /// An OpenAI-compatible chat-completions endpoint.
    OpenAi(OpenAiConfig),
}

/// Builds a [`Host`]. Every seam an embedder needs is open: the store
/// ([`store`](Self::store)), who answers model steps
/// ([`models`](Self::models)), the clock ([`clock`](Self::clock)), the
/// capability policy built in code ([`policy`](Self::policy)), the limits
/// of a guest call ([`limits`](Self::limits)) and the plugins
/// ([`plugin`](Self::plugin)).
#[derive(Debug, Clone)]
#[must_use]
pub struct HostBuilder {
    store: StoreChoice,
    store_check: poimen_store::OpenCheck,
    plugin_dirs: Vec<PathBuf>,
    policy: Option<PathBuf>,
    bundled: bool,
    cache_dir: Option<PathBuf>,
    model: ModelChoice,
    host_id: String,
    lease_ttl: std::time::Duration,
    scheduler: poimen_executor::SchedulerConfig,
    open: crate::builder::Seams,
}

impl Default for HostBuilder {
    fn default() -> Self {
        HostBuilder {
            store: StoreChoice::Memory,
            store_check: poimen_store::OpenCheck::Full,
            plugin_dirs: Vec::new(),
            policy: None,
            bundled: true,
            cache_dir: None,
            model: ModelChoice::None,
            host_id: "local".to_owned(),
            lease_ttl: std::time::Duration::from_millis(
                poimen_executor::DEFAULT_LEASE_TTL_MS as u64,
            ),
            scheduler: poimen_executor::SchedulerConfig::default(),
            open: crate::builder::Seams::default(),
        }
    }
}

impl HostBuilder {
    /// Keep versions and runs in the SQLite file at `path` (created if absent).
    pub fn store_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.store = StoreChoice::Sqlite(path.into());
        self
    }

    /// Keep versions and runs in the store `url` names: `postgres://…` (a
    /// PostgreSQL database several hosts may share), `sqlite://PATH`, or a
    /// plain file path (SQLite). Checked when the host is built: any other
    /// scheme is refused naming the accepted ones.
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Url(url.into());
        self
    }

    /// How much of an SQLite store file's structure the open checks:
    /// [`OpenCheck::Full`](poimen_store::OpenCheck::Full) (`PRAGMA
    /// quick_check`, the default) or, for a host that only reads,
    /// [`OpenCheck::Header`](poimen_store::OpenCheck::Header) (constant
    /// time; SQLite still checks each page a read reaches). No effect on
    /// other stores.
    pub fn store_check(mut self, check: poimen_store::OpenCheck) -> Self {
        self.store_check = check;
        self
    }

    /// Keep versions and runs in a store the embedder opened (any
    /// [`Store`] implementation, e.g. a wrapper around one of poimen's).
    pub fn store(self, store: impl Store + 'static) -> Self {
        self.shared_store(Arc::new(store))
    }

    /// [`store`](Self::store), for a store the embedder also holds.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = StoreChoice::Given(store);
        self
    }

    /// Keep everything in memory (the default; gone when the host is dropped).
    pub fn memory_store(mut self) -> Self {
        self.store = StoreChoice::Memory;
        self
    }

    /// Also load every component in this directory.
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dirs.push(dir.into());
        self
    }

    /// The capability policy file (TOML). Without one, nothing beyond the
    /// baseline and `scratch` is granted. Replaces a [`policy`](Self::policy)
    /// given before.
    pub fn policy_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy = Some(path.into());
        self.open.policy = None;
        self
    }

    /// The capability policy, built in code: the same [`Policy`] a policy
    /// file parses into. Replaces a [`policy_file`](Self::policy_file)
    /// given before.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.open.policy = Some(policy);
        self.policy = None;
        self
    }

    /// The limits every guest call runs under before the policy's
    /// per-plugin overrides (default [`CallLimits::default`]).
    pub fn limits(mut self, limits: CallLimits) -> Self {
        self.open.limits = Some(limits);
        self
    }

    /// Also load this component: its bytes (`Vec<u8>`, `&'static [u8]`,
    /// [`PluginSource::bytes`] with a name for errors) or a `.wasm` file
    /// (`PathBuf`, `&Path`). Checked at build exactly as a plugin directory's
    /// components are; its name is reserved as the bundled plugins' are.
    pub fn plugin(mut self, plugin: impl Into<PluginSource>) -> Self {
        self.open.plugins.push(plugin.into());
        self
    }

    /// How many commits the event channel holds for its slowest subscriber
    /// before that subscriber is told it lagged (default
    /// [`EVENT_BUFFER`](crate::EVENT_BUFFER)). Runs never wait for a
    /// subscriber, whatever this is.
    pub fn event_buffer(mut self, commits: usize) -> Self {
        self.open.event_buffer = Some(commits);
        self
    }

    /// Whether the host keeps its Prometheus metrics
    /// ([`Host::metrics_text`]; default on). Off, the stores are not
    /// observed for them and the text has only the scheduler's gauges.
    pub fn metrics(mut self, on: bool) -> Self {
        self.open.metrics = Some(on);
        self
    }

    /// How a run's span continues the trace its starter recorded
    /// ([`RunOptions::trace`]) when the run is driven outside that
    /// starter's span — claimed from the queue by [`Host::serve`], taken
    /// over, resumed. `parent` is given the `run` span and the recorded
    /// carrier; with `tracing-opentelemetry` it extracts the context and
    /// calls `OpenTelemetrySpanExt::set_parent` (what `poimen serve` does).
    pub fn trace_parent(
        mut self,
        parent: impl Fn(&tracing::Span, &poimen_executor::TraceCarrier) + Send + Sync + 'static,
    ) -> Self {
        self.open.trace_parent = Some(poimen_executor::TraceParent(Arc::new(parent)));
        self
    }

    /// Who answers model steps: any [`ModelProvider`] (a scripted one in
    /// tests, a service's own gateway). Replaces [`model`](Self::model).
    pub fn models(mut self, models: impl ModelProvider + 'static) -> Self {
        self.open.models = Some(crate::builder::Shared(Arc::new(models)));
        self
    }

    /// The clock runs read (default: the system clock). Every time a run
    /// records comes from it.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.open.clock = Some(crate::builder::Shared(Arc::new(clock)));
        self
    }

    /// [`clock`](Self::clock), for a clock the embedder also holds (to move
    /// a manual clock from a test).
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.open.clock = Some(crate::builder::Shared(clock));
        self
    }

    /// Whether the first-party plugins are registered (default: yes).
    pub fn bundled_plugins(mut self, on: bool) -> Self {
        self.bundled = on;
        self
    }

    /// Where compiled components are cached.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Who answers model steps, among poimen's providers. Replaces
    /// [`models`](Self::models).
    pub fn model(mut self, model: ModelChoice) -> Self {
        self.model = model;
        self.open.models = None;
        self
    }

    /// This host's id: the owner named in the leases of the runs it drives
    /// (default `local`). Hosts serving one store need distinct ids.
    pub fn host_id(mut self, id: impl Into<String>) -> Self {
        self.host_id = id.into();
        self
    }

    /// How long a run's lease lasts unrenewed (default 30 s): another host
    /// takes a run over this long after its driver stopped.
    pub fn lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Step executions (tool and model attempts) this host runs at once
    /// (default 8); ready steps beyond them wait, higher priority first.
    /// Resets the pressure thresholds to 4 and 16 waiting steps per worker.
    pub fn workers(mut self, workers: usize) -> Self {
        self.scheduler = poimen_executor::SchedulerConfig::workers(workers);
        self
    }

    /// The queue depths (waiting steps) from which this host's pressure is
    /// `warn` (new `low` runs shed) and `shed` (new `normal` runs shed too).
    pub fn pressure(mut self, warn_queue: usize, shed_queue: usize) -> Self {
        self.scheduler.warn_queue = warn_queue;
        self.scheduler.shed_queue = shed_queue.max(warn_queue);
        self
    }

    /// Opens the store, loads the plugins and starts the host.
    pub async fn build(self) -> Result<Host, Error> {
        // A URL naming an SQLite file is the same as a path.
        let choice = match &self.store {
            StoreChoice::Url(url) => match poimen_store::StoreUrl::parse(url)? {
                poimen_store::StoreUrl::Sqlite(path) => StoreChoice::Sqlite(path),
                _ => self.store.clone(),
            },
            other => other.clone(),
        };
        let store: Arc<dyn Store> = match &choice {
            StoreChoice::Sqlite(path) => Arc::new(
                SqliteStore::open_with(
                    path.clone(),
                    poimen_store::SqliteOptions {
                        check: self.store_check,
                        ..Default::default()
                    },
                )
                .await?,
            ),
            StoreChoice::Url(url) => poimen_store::open_store(url).await?,
            StoreChoice::Given(store) => store.clone(),
            StoreChoice::Memory => Arc::new(MemoryStore::new()),
        };
        // A plugin whose declared capabilities the policy does not grant is
        // withheld, not fatal: the host starts, `plugin list` shows why, and a
        // workflow that uses it is rejected at load naming the capability.
        let mut sb = poimen_sandbox::PluginHost::builder().withhold_ungranted(true);
        if let Some(dir) = &self.cache_dir {
            sb = sb.cache_dir(dir.clone());
        } else if let StoreChoice::Sqlite(path) = &choice
            && let Some(parent) = path.parent()
        {
            sb = sb.cache_dir(parent.join("cache"));
        }
        // One policy, read once: the sandbox takes its grants and limits,
        // the executor and this host what it says of workflows and runs.
        let policy = match (&self.open.policy, &self.policy) {
            (Some(p), _) => p.clone(),
            (None, Some(path)) => poimen_sandbox::Policy::from_file(path)
                .map_err(|e| Error::Sandbox(poimen_sandbox::BuildError::Policy(e)))?,
            (None, None) => poimen_sandbox::Policy::new(),
        };
        sb = sb.policy(policy.clone());
        if let Some(limits) = self.open.limits {
            sb = sb.limits(limits);
        }
        for d in &self.plugin_dirs {
            sb = sb.plugin_dir(d.clone());
        }
        if self.bundled {
            for b in bundled_plugins::BUNDLED {
                sb = sb.component_bytes(format!("bundled:{}", b.ident), b.bytes);
            }
        }
        for p in &self.open.plugins {
            let (origin, bytes) = p.read()?;
            sb = sb.component_bytes(origin, bytes);
        }
        let sandbox = sb.build().await?;
        let models: Arc<dyn ModelProvider> = match (self.open.models, self.model) {
            (Some(custom), _) => custom.0,
            (None, ModelChoice::None) => Arc::new(crate::NoModel),
            (None, ModelChoice::Scripted(rules)) => {
                Arc::new(poimen_executor::model::ScriptedProvider::new(rules))
            }
            (None, ModelChoice::OpenAi(cfg)) => {
                Arc::new(poimen_executor::model::OpenAiCompatible::new(cfg))
            }
        };
        let clock: Arc<dyn Clock> = match self.open.clock {
            Some(c) => c.0,
            None => Arc::new(SystemClock),
        };
        // Every commit of every run, durable or not, is announced to whoever
        // follows runs (events, handles, the HTTP API).
        let hub = Hub::new(
            self.open
                .event_buffer
                .unwrap_or(crate::events::EVENT_BUFFER),
        );
        let metrics = Arc::new(crate::metrics::Metrics::new(
            self.open.metrics.unwrap_or(true),
        ));
        let store: Arc<dyn Store> = Arc::new(Observed::new(store, hub.clone(), metrics.clone()));
        let ephemeral: Arc<dyn Store> = Arc::new(Observed::new(
            Arc::new(MemoryStore::new()),
            hub.clone(),
            metrics.clone(),
        ));
        let wiring = Wiring::with_ephemeral_store(
            store,
            ephemeral,
            sandbox,
            models.clone(),
            clock.clone(),
            poimen_executor::ExecutorConfig {
                host_id: self.host_id.clone(),
                lease_ttl_ms: i64::try_from(self.lease_ttl.as_millis())
                    .unwrap_or(i64::MAX)
                    .max(1),
                durable_by_default: policy.runs().durability
                    == poimen_sandbox::policy::DurabilityDefault::Durable,
                judgment_timeout: policy.runs().judgment.timeout,
                judgment_fallback: policy.runs().judgment.on_timeout.clone(),
                output_bytes: policy.runs().bounds.output_bytes,
                scheduler: self.scheduler,
                trace_parent: self.open.trace_parent.clone(),
                tail: poimen_executor::TailBound {
                    events: policy
                        .runs()
                        .tail
                        .events
                        .unwrap_or(poimen_executor::TailBound::DEFAULT.events),
                    ms: policy
                        .runs()
                        .tail
                        .ms
                        .unwrap_or(poimen_executor::TailBound::DEFAULT.ms),
                },
            },
        );
        Ok(Host {
            inner: Arc::new(Inner {
                wiring,
                models,
                policy,
                clock,
                hub,
                metrics,
            }),
        })
    }
}

pub(crate) struct Inner {
    pub(crate) wiring: Wiring,
    models: Arc<dyn ModelProvider>,
    /// The host's one policy (also the sandbox's).
    policy: poimen_sandbox::Policy,
    /// The clock runs read; publishing stamps versions with it too.
    clock: Arc<dyn Clock>,
    /// Where the stores announce commits.
    hub: Arc<Hub>,
    /// What the stores saw, for `/metrics`.
    metrics: Arc<crate::metrics::Metrics>,
}

impl Inner {
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.wiring.store
    }

    pub(crate) fn sandbox(&self) -> &poimen_sandbox::PluginHost {
        &self.wiring.sandbox
    }

    pub(crate) fn executor(&self) -> &poimen_executor::Executor {
        &self.wiring.executor
    }
}

/// The poimen host.
#[derive(Clone)]
pub struct Host {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").finish_non_exhaustive()
    }
}

/// What to run or plan: a workflow file, or a published version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    File(PathBuf),
    Version(String),
}

impl Target {
    /// A path that exists is a file; `b3:…` or bare hex is a version.
    pub fn parse(s: &str) -> Target {
        if Path::new(s).exists()
            || s.ends_with(".yaml")
            || s.ends_with(".yml")
            || s.ends_with(".json")
        {
            Target::File(PathBuf::from(s))
        } else {
            Target::Version(s.to_owned())
        }
    }
}

/// A workflow read from a file.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub def: WorkflowDef,
    pub version: WorkflowVersion,
}

/// How a run starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// The same (version, input) under this key returns the existing run;
    /// another input under it is refused. Keys are global across tenants.
    pub idempotency_key: Option<String>,
    /// The run's tenant (`default` when absent): stored with the run and
    /// its children, and a filter when listing runs.
    pub tenant: Option<String>,
    /// The starter's trace context (W3C `traceparent` and `tracestate`),
    /// recorded with the run's start so that whichever host drives it
    /// continues that trace ([`HostBuilder::trace_parent`]).
    pub trace: Option<poimen_executor::TraceCarrier>,
}

impl RunOptions {
    /// A run under an idempotency key.
    pub fn key(key: impl Into<String>) -> RunOptions {
        RunOptions {
            idempotency_key: Some(key.into()),
            ..RunOptions::default()
        }
    }

    fn into_start(self) -> StartOptions {
        StartOptions {
            idempotency_key: self.idempotency_key,
            tenant: self
                .tenant
                .map(poimen_executor::TenantId)
                .unwrap_or_default(),
            trace: self.trace,
            waited: false,
        }
    }
}

/// Which version a newly published one descends from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Parent<'a> {
    /// The workflow's latest stored version (none for its first).
    #[default]
    Latest,
    /// This version: a full version, an abbreviation, or `ID@latest`.
    Version(&'a str),
    /// None: the version starts a new history.
    Root,
}

/// What publishing did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    pub workflow: WorkflowId,
    pub version: WorkflowVersion,
    pub parent: Option<WorkflowVersion>,
    /// False when identical content was already published (nothing written).
    pub created: bool,
    /// A parent that was asked for but not recorded (records never change).
    pub ignored_parent: Option<WorkflowVersion>,
}

/// A step as the execution plan shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedStep {
    pub id: StepId,
    pub kind: &'static str,
    /// The Parallel or Conditional step that runs this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<StepId>,
    /// Steps it runs (branches, conditional targets).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<StepId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<poimen_workflow::ToolInfo>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verifiers: Vec<poimen_workflow::ToolInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_workflow: Option<WorkflowVersion>,
    pub max_attempts: u32,
    pub timeout_ms: u64,
}

/// The execution plan of a workflow.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub workflow: WorkflowId,
    pub version: WorkflowVersion,
    /// Top-level steps in the order they run, each followed by the steps it owns.
    pub steps: Vec<PlannedStep>,
    /// Bounded loops: (from, to, max iterations).
    pub loops: Vec<(StepId, StepId, u32)>,
    pub eligibility: EligibilityReport,
    pub long_lived: bool,
}

impl Host {
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// Reads and parses a workflow file (`.yaml`, `.yml` or `.json`).
    pub fn load_file(&self, path: &Path) -> Result<Loaded, Error> {
        load_file(path)
    }

    /// Validates a definition against this host's registries and store,
    /// then against what its policy says of workflows.
    pub async fn validate(&self, def: &WorkflowDef) -> Result<Validated, Error> {
        let v = check(&**self.inner.store(), self.inner.sandbox(), def)
            .await
            .map_err(|e| match Error::from(e) {
                Error::Invalid { errors, .. } => Error::Invalid {
                    workflow: def.id.to_string(),
                    errors,
                },
                other => other,
            })?;
        self.tool_name_free(def).await?;
        let violations = crate::policy::violations(&v, self.inner.policy.runs());
        if !violations.is_empty() {
            return Err(Error::Policy {
                workflow: def.id.to_string(),
                violations,
            });
        }
        Ok(v)
    }

    /// A workflow that declares `tool:` must take a name no component and
    /// no other workflow has.
    async fn tool_name_free(&self, def: &WorkflowDef) -> Result<(), Error> {
        let Some(tool) = &def.tool else {
            return Ok(());
        };
        let name = tool.name.clone().unwrap_or_else(|| def.id.to_string());
        let taken = |by: String| Error::ToolNameTaken {
            workflow: def.id.to_string(),
            name: name.clone(),
            by,
        };
        if let Some(c) = self
            .inner
            .sandbox()
            .tools()
            .list()
            .into_iter()
            .find(|e| e.info.name == name)
        {
            return Err(taken(format!(
                "the component `{}` {}",
                c.info.name, c.info.version
            )));
        }
        let registered = crate::loader::workflow_tools(&**self.inner.store(), self.inner.sandbox())
            .await
            .map_err(Error::from)?;
        if let Some((holder, _)) = registered.defs.get(&name)
            && *holder != def.id
        {
            return Err(taken(format!("workflow `{holder}`")));
        }
        Ok(())
    }

    /// The host's policy (grants, limits, and what it says of workflows).
    pub fn policy(&self) -> &poimen_sandbox::Policy {
        &self.inner.policy
    }

    /// Whether a run of `target` may start here: the policy's workflows
    /// must be enabled, the workflow among its enabled ids, and — unless it
    /// allows custom definitions — the target a published version, never
    /// a file a client names.
    fn may_start(&self, target: &Target, workflow: &str) -> Result<(), Error> {
        let rules = &self.inner.policy.runs().workflows;
        if let Some(why) = rules.refuses(workflow) {
            return Err(Error::NotAllowed {
                workflow: workflow.to_owned(),
                why,
            });
        }
        if let Target::File(path) = target
            && !rules.allow_custom_definitions
        {
            return Err(Error::NotAllowed {
                workflow: workflow.to_owned(),
                why: format!(
                    "the policy allows no custom definitions (`[workflows] allow-custom-definitions = false`), so a run cannot start from {}; publish and arm the workflow, then start it by id",
                    path.display()
                ),
            });
        }
        Ok(())
    }

    /// Validates and publishes a definition. A definition that does not
    /// validate is never published.
    pub async fn publish(&self, def: &WorkflowDef, parent: Parent<'_>) -> Result<Published, Error> {
        let validated = self.validate(def).await?;
        let parent = match parent {
            Parent::Latest => self.latest_other(&validated).await?,
            Parent::Version(p) => Some(self.resolve_version(p).await?),
            Parent::Root => None,
        };
        self.publish_validated(&validated, parent).await
    }

    /// The workflow's latest stored version, unless it is `v` itself: the
    /// parent a newly published version records by default, so the
    /// version DAG stays connected.
    async fn latest_other(&self, v: &Validated) -> Result<Option<WorkflowVersion>, Error> {
        Ok(self
            .inner
            .store()
            .latest_version(&v.def().id)
            .await?
            .map(|r| r.version)
            .filter(|p| *p != v.version()))
    }

    async fn publish_validated(
        &self,
        v: &Validated,
        parent: Option<WorkflowVersion>,
    ) -> Result<Published, Error> {
        let def = v.def();
        let out = self
            .inner
            .store()
            .publish_version(poimen_store::NewVersion::of(
                def.id.clone(),
                poimen_workflow::canonical_bytes(def),
                parent,
                self.inner.clock.now_ms(),
            ))
            .await?;
        Ok(match out {
            poimen_store::PublishOutcome::Created(r) => Published {
                workflow: r.workflow_id,
                version: r.version,
                parent: r.parent,
                created: true,
                ignored_parent: None,
            },
            poimen_store::PublishOutcome::Existing {
                record,
                ignored_parent,
            } => Published {
                workflow: record.workflow_id,
                version: record.version,
                parent: record.parent,
                created: false,
                ignored_parent,
            },
        })
    }

    /// The one stored version a full version, an abbreviation, or
    /// `WORKFLOW_ID@latest` (the last published) names.
    pub async fn resolve_version(&self, text: &str) -> Result<WorkflowVersion, Error> {
        if let Some(id) = text.strip_suffix("@latest") {
            return match self
                .inner
                .store()
                .latest_version(&poimen_workflow::WorkflowId::from(id))
                .await?
            {
                Some(record) => Ok(record.version),
                None => Err(Error::NotFound {
                    what: "workflow",
                    given: id.to_owned(),
                    hint: "`poimen versions` lists published workflows; publish it with `poimen publish FILE`".into(),
                }),
            };
        }
        let prefix = match VersionPrefix::parse(text) {
            Ok(prefix) => prefix,
            Err(e) => {
                // Not a version: a workflow id names its armed version.
                if let Some(v) = self.armed_version_of(text).await? {
                    return Ok(v);
                }
                return Err(Error::BadTarget {
                    given: text.to_owned(),
                    detail: e.to_string(),
                });
            }
        };
        match self.inner.store().resolve_version_prefix(&prefix).await {
            Ok(v) => Ok(v),
            Err(StoreError::NotFound { .. }) => Err(Error::NotFound {
                what: "version",
                given: text.to_owned(),
                hint: "`poimen versions WORKFLOW_ID` lists published versions".into(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// A stored version and its definition.
    pub async fn version(
        &self,
        version: &WorkflowVersion,
    ) -> Result<(VersionRecord, WorkflowDef), Error> {
        let record = self
            .inner
            .store()
            .version(version)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "version",
                given: version.to_string(),
                hint: "`poimen versions WORKFLOW_ID` lists published versions".into(),
            })?;
        let def =
            poimen_workflow::from_canonical(&record.canonical).map_err(|e| Error::Unreadable {
                version: *version,
                detail: e.to_string(),
            })?;
        Ok((record, def))
    }

    /// The stored version `text` names ([`resolve_version`](Self::resolve_version))
    /// and its definition.
    pub async fn find_version(&self, text: &str) -> Result<(VersionRecord, WorkflowDef), Error> {
        let v = self.resolve_version(text).await?;
        self.version(&v).await
    }

    /// Every version of a workflow, with parents, in publish order.
    pub async fn versions(&self, workflow: &WorkflowId) -> Result<Vec<VersionRecord>, Error> {
        let list = self.inner.store().versions_of(workflow).await?;
        if list.is_empty() {
            let known: Vec<String> = self
                .inner
                .store()
                .workflows()
                .await?
                .into_iter()
                .map(|w| w.workflow_id.to_string())
                .collect();
            let nearest = poimen_workflow::registry::nearest_names(
                workflow.as_str(),
                known.iter().map(String::as_str),
            );
            return Err(Error::NotFound {
                what: "workflow",
                given: workflow.to_string(),
                hint: if nearest.is_empty() {
                    "publish it first with `poimen publish FILE`".into()
                } else {
                    format!("did you mean {}?", nearest.join(", "))
                },
            });
        }
        Ok(list)
    }

    /// Every published workflow.
    pub async fn workflows(&self) -> Result<Vec<WorkflowSummary>, Error> {
        Ok(self.inner.store().workflows().await?)
    }

    /// Loads, validates and prepares a target: a file is validated and
    /// published first; a version is loaded from the store.
    async fn prepare(&self, target: &Target) -> Result<Validated, Error> {
        match target {
            Target::File(path) => {
                let loaded = load_file(path)?;
                let v = self.validate(&loaded.def).await?;
                let parent = self.latest_other(&v).await?;
                self.publish_validated(&v, parent).await?;
                Ok(v)
            }
            Target::Version(text) => {
                let (_, def) = self.find_version(text).await?;
                self.validate(&def).await
            }
        }
    }

    /// [`prepare`](Self::prepare) for a new run: the policy must let the
    /// workflow start (a file is read, but neither published nor run, when
    /// it may not).
    async fn prepare_run(&self, target: &Target) -> Result<Validated, Error> {
        let (workflow, version, stored) = match target {
            Target::File(path) => {
                let loaded = load_file(path)?;
                (loaded.def.id, loaded.version, None)
            }
            Target::Version(text) => {
                let (record, def) = self.find_version(text).await?;
                (def.id.clone(), record.version, Some(def))
            }
        };
        self.may_start(target, workflow.as_str())?;
        self.check_armed(&workflow, &version).await?;
        match stored {
            // A stored version, found once: validated as found.
            Some(def) => self.validate(&def).await,
            None => self.prepare(target).await,
        }
    }

    /// The execution plan: steps in order, fan-outs, resolved tools with
    /// digests, sub-workflow versions, sandbox eligibility.
    pub async fn plan(&self, target: &Target) -> Result<Plan, Error> {
        let v = match target {
            Target::File(path) => self.validate(&load_file(path)?.def).await?,
            Target::Version(_) => self.prepare(target).await?,
        };
        Ok(plan_of(&v))
    }

    /// Runs a workflow on an input until it ends, waits or blocks.
    pub async fn run(
        &self,
        target: &Target,
        input: Value,
        opts: RunOptions,
    ) -> Result<RunOutcome, Error> {
        let v = self.prepare_run(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        Ok(self
            .inner
            .executor()
            .run(runnable, input, opts.into_start())
            .await?)
    }

    /// Starts a run and returns its handle without waiting for it: the run
    /// is driven by a task of this host's, whose result reaches the handle
    /// ([`RunHandle::wait`]). The task continues the caller's tracing span,
    /// so a caller's trace goes on into the run.
    pub async fn start(
        &self,
        target: &Target,
        input: Value,
        opts: RunOptions,
    ) -> Result<RunHandle, Error> {
        self.start_driven(target, input, opts.into_start()).await
    }

    /// [`start`](Self::start) for a caller that waits for the run to stop
    /// before it tells anyone of it (the one-request start of the HTTP
    /// API): the run's start is made durable with its next durable commit
    /// rather than before this returns, so a run with nothing in between
    /// that must be durable costs one fsync
    /// ([`StartOptions::waited`](poimen_executor::StartOptions::waited)).
    /// Hand the run's id out only after [`RunHandle::stopped_within`] has
    /// returned: if the run has not stopped by then, it makes the start
    /// durable first.
    pub async fn start_waiting(
        &self,
        target: &Target,
        input: Value,
        opts: RunOptions,
    ) -> Result<RunHandle, Error> {
        let opts = StartOptions {
            waited: true,
            ..opts.into_start()
        };
        Ok(self.start_driven(target, input, opts).await?.deferred())
    }

    async fn start_driven(
        &self,
        target: &Target,
        input: Value,
        opts: StartOptions,
    ) -> Result<RunHandle, Error> {
        let v = self.prepare_run(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        let started = self.inner.executor().start(runnable, input, opts).await?;
        let exec = self.inner.executor().clone();
        let id = started.run.clone();
        let (tx, rx) = tokio::sync::watch::channel::<Driven>(None);
        let run = id.clone();
        let drive = async move {
            let result = exec.drive_started(started).await;
            if let Err(e) = &result {
                tracing::warn!(run = %run, error = %e, "a started run stopped with an error");
            }
            // No receiver left is fine: nobody waits for it.
            let _ = tx.send(Some(result.map_err(Arc::new)));
        };
        tokio::spawn(tracing::Instrument::in_current_span(drive));
        Ok(RunHandle::new(id, self.clone(), Some(rx)))
    }

    /// A handle to a run, wherever it is driven: to wait for it (through
    /// the store), cancel it, follow its events.
    pub fn handle(&self, run: &RunId) -> RunHandle {
        RunHandle::new(run.clone(), self.clone(), None)
    }

    /// Every committed event of every run this host's stores hold that
    /// `filter` lets through, as it is committed (by this host). Bounded: a
    /// subscriber that falls behind gets [`HostEvent::Lagged`] with how many
    /// commits it missed, and never slows a run.
    pub fn events(
        &self,
        filter: EventFilter,
    ) -> impl futures::Stream<Item = HostEvent> + Send + 'static {
        crate::events::host_events(self.inner.store().clone(), &self.inner.hub, filter)
    }

    /// A run's events from sequence number `from` on, then each as it is
    /// committed, gapless; the stream ends after the event that ends the
    /// run (see [`RunHandle::events`]).
    pub fn run_events(
        &self,
        run: &RunId,
        from: u64,
    ) -> impl futures::Stream<Item = Result<RunEvent, Error>> + Send + 'static {
        crate::events::run_events(
            self.inner.executor().clone(),
            &self.inner.hub,
            run.clone(),
            from,
        )
    }

    /// Whether the store answers (one cheap read): for readiness checks.
    pub async fn check_store(&self) -> Result<(), Error> {
        self.inner
            .store()
            .list_runs(RunFilter {
                limit: Some(1),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// Enqueues a run and returns its id: the run is stored `queued`, held
    /// by no host, and driven by whichever host serving this store claims
    /// it first ([`Host::serve`]). Its version is published and pinned now.
    pub async fn enqueue(
        &self,
        target: &Target,
        input: Value,
        opts: RunOptions,
    ) -> Result<RunId, Error> {
        let v = self.prepare_run(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        let started = self
            .inner
            .executor()
            .enqueue(runnable, input, opts.into_start())
            .await?;
        Ok(started.run)
    }

    /// The step scheduler's counts and state now: workers, queue,
    /// pressure, runs shed by priority.
    pub fn scheduler(&self) -> poimen_executor::SchedulerStats {
        self.inner.executor().scheduler()
    }

    /// The host's metrics in the Prometheus text format (what `/metrics`
    /// serves): runs created and ended by status, step and guest-call
    /// latency, fuel and peak memory per call, store commit latency and
    /// errors, lease claims and takeovers, runs shed by priority, and the
    /// scheduler's workers, queue and pressure level as of now.
    pub fn metrics_text(&self) -> String {
        self.inner.metrics.render(&self.scheduler())
    }

    /// Serves the store until `shutdown` resolves: claims queued runs and
    /// runs whose host stopped (lease expired), drives up to
    /// `opts.workers` at once, renews their leases, and on shutdown hands
    /// back what it holds (see [`poimen_executor::ServeOptions`]).
    pub async fn serve(
        &self,
        opts: poimen_executor::ServeOptions,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<poimen_executor::ServeReport, Error> {
        Ok(self.inner.executor().serve(opts, shutdown).await?)
    }

    /// Waits until a run completes, fails, is cancelled, blocks or waits
    /// for a judgment — whichever host drives it — and returns its record;
    /// [`Error::Timeout`] after `timeout`.
    pub async fn wait(
        &self,
        run: &RunId,
        timeout: Option<std::time::Duration>,
    ) -> Result<RunRecord, Error> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            let rec = self.inner.executor().status(run).await?;
            if !matches!(rec.status, RunStatus::Running | RunStatus::Queued) {
                return Ok(rec);
            }
            if let Some(d) = deadline
                && tokio::time::Instant::now() >= d
            {
                return Err(Error::Timeout {
                    run: run.clone(),
                    status: rec.status,
                    after: timeout.unwrap_or_default(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    /// A run's record and its state refolded from the episode.
    pub async fn status(&self, run: &RunId) -> Result<(RunRecord, RunState), Error> {
        let rec = self.inner.executor().status(run).await?;
        let state = self.inner.executor().state(run).await?;
        Ok((rec, state))
    }

    /// Recent runs, newest first.
    pub async fn runs(&self, limit: u32, tenant: Option<&str>) -> Result<Vec<RunRecord>, Error> {
        self.list_runs(RunFilter {
            limit: Some(limit),
            tenant: tenant.map(str::to_owned),
            ..Default::default()
        })
        .await
    }

    /// Runs matching every set field of `filter` (status, workflow,
    /// tenant, parent, how many), newest first.
    pub async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, Error> {
        Ok(self.inner.store().list_runs(filter).await?)
    }

    /// How many runs match `filter` in each status (its `status`, `before`
    /// and `limit` ignored), in [`RunStatus::ALL`] order.
    pub async fn count_runs(&self, filter: RunFilter) -> Result<Vec<(RunStatus, u64)>, Error> {
        Ok(self.inner.store().count_runs(filter).await?)
    }

    /// The bytes stored under a blob hash (`b3:` and 64 hex digits) — a
    /// model's prompt or answer, a run's input or output — re-hashed on
    /// read; `None` when the store holds none.
    pub async fn blob(&self, hash: &str) -> Result<Option<Vec<u8>>, Error> {
        let hash: poimen_store::BlobHash = hash.parse()?;
        Ok(self.inner.store().blob(&hash).await?)
    }

    /// A run's episode.
    pub async fn episode(&self, run: &RunId) -> Result<Episode, Error> {
        Ok(self.inner.executor().episode(run).await?)
    }

    /// A run's intents, tool calls and verdicts with their hostcall records.
    pub async fn audit(&self, run: &RunId) -> Result<Audit, Error> {
        let rec = self.inner.executor().status(run).await?;
        let intents = self.inner.executor().intents(run).await?;
        let episode = self.inner.executor().episode(run).await?;
        Ok(Audit::of(rec, intents, &episode))
    }

    /// Drives a stopped run again (see [`poimen_executor::Executor::resume`]).
    pub async fn resume(&self, run: &RunId) -> Result<RunOutcome, Error> {
        Ok(self.inner.executor().resume(run).await?)
    }

    /// Cancels a run.
    pub async fn cancel(&self, run: &RunId) -> Result<RunRecord, Error> {
        Ok(self
            .inner
            .executor()
            .cancel(run, "cancelled by an operator")
            .await?)
    }

    /// Runs a failed run again from a step (by default the one that failed).
    pub async fn retry(&self, run: &RunId, from: Option<&StepId>) -> Result<RunOutcome, Error> {
        Ok(self.inner.executor().retry(run, from.cloned()).await?)
    }

    /// Records an operator's decision on a tool call with an unknown outcome.
    pub async fn reconcile(
        &self,
        run: &RunId,
        step: &StepId,
        decision: Reconciliation,
    ) -> Result<RunOutcome, Error> {
        Ok(self.inner.executor().reconcile(run, step, decision).await?)
    }

    /// Open judgment requests.
    pub async fn judgments(&self) -> Result<Vec<JudgmentRecord>, Error> {
        Ok(self.inner.executor().open_judgments().await?)
    }

    /// One judgment request.
    pub async fn judgment(&self, id: &JudgmentId) -> Result<JudgmentRecord, Error> {
        Ok(self.inner.executor().judgment(id.as_str()).await?)
    }

    /// Submits a judge's answer.
    pub async fn submit_judgment(
        &self,
        id: &JudgmentId,
        submission: JudgmentSubmission,
    ) -> Result<RunOutcome, Error> {
        Ok(self
            .inner
            .executor()
            .submit_judgment(id.as_str(), submission)
            .await?)
    }

    /// Drives every run this host left in flight.
    pub async fn recover(&self) -> Result<Vec<RunOutcome>, Error> {
        Ok(self.inner.executor().recover().await?)
    }

    /// Invokes one tool directly through the sandbox (`poimen plugin call`):
    /// its outcome (the output, or why there is none) and its hostcall
    /// record, which is there either way.
    pub async fn call_tool(
        &self,
        tool: ToolRef,
        args: Value,
        idempotency_key: impl Into<String>,
    ) -> Invocation {
        self.inner
            .sandbox()
            .invoke_tool(poimen_sandbox::ToolRequest::new(
                tool,
                args,
                idempotency_key,
            ))
            .await
    }

    /// Shadow-evaluates `candidate` (a file, validated but not published,
    /// or a stored version) on the recorded runs of `baseline` (a stored
    /// version) that `opts` selects, and compares the outcomes. Both must
    /// be sandbox-eligible; nothing is written to the live store.
    pub async fn shadow(
        &self,
        candidate: &Target,
        baseline: &str,
        opts: &crate::shadow::ShadowOptions,
    ) -> Result<crate::shadow::ShadowReport, Error> {
        let candidate = match candidate {
            Target::File(path) => self.validate(&load_file(path)?.def).await?,
            Target::Version(text) => {
                let (_, def) = self.find_version(text).await?;
                self.validate(&def).await?
            }
        };
        let (_, baseline_def) = self.find_version(baseline).await?;
        let baseline = self.validate(&baseline_def).await?;
        let bench = crate::shadow::Bench {
            live: self.inner.store().clone(),
            sandbox: self.inner.sandbox().clone(),
            models: self.inner.models.clone(),
            live_executor: self.inner.executor(),
        };
        Ok(crate::shadow::evaluate(bench, &baseline, &candidate, opts).await?)
    }

    /// Registered tools.
    pub fn tools(&self) -> Vec<poimen_sandbox::Entry> {
        self.inner.sandbox().tools().list()
    }

    /// Registered verifiers.
    pub fn verifiers(&self) -> Vec<poimen_sandbox::Entry> {
        self.inner.sandbox().verifiers().list()
    }

    /// Installed plugins withheld because the policy does not grant a
    /// capability they declare, each with the reason and how to grant it.
    pub fn withheld_plugins(&self) -> Vec<poimen_sandbox::WithheldEntry> {
        self.inner.sandbox().withheld()
    }

    /// Installed plugin files the host refused to load (it started without
    /// them), each with the reason.
    pub fn refused_plugins(&self) -> Vec<poimen_sandbox::RefusedEntry> {
        self.inner.sandbox().refused()
    }

    /// What a component says and imports, without registering it.
    pub async fn inspect_plugin(
        &self,
        bytes: Vec<u8>,
    ) -> Result<poimen_sandbox::Inspection, Error> {
        Ok(self.inner.sandbox().inspect(bytes).await?)
    }

    /// Published workflows that declare `tool:` (exposed to MCP clients),
    /// with their latest definitions.
    pub async fn workflow_tools(&self) -> Result<Vec<(WorkflowVersion, WorkflowDef)>, Error> {
        let registered =
            crate::loader::workflow_tools(&**self.inner.store(), self.inner.sandbox()).await?;
        Ok(registered
            .defs
            .into_iter()
            .filter_map(|(name, (_, def))| {
                let version = registered.tools.get(&name)?.workflow?;
                Some((version, def))
            })
            .collect())
    }
}

/// Reads and parses a workflow file.
pub fn load_file(path: &Path) -> Result<Loaded, Error> {
    let format =
        Format::from_path(&path.to_string_lossy()).ok_or_else(|| Error::UnknownFormat {
            path: path.to_owned(),
        })?;
    let meta = std::fs::metadata(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    if meta.len() > MAX_WORKFLOW_FILE_BYTES {
        return Err(Error::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
            limit: MAX_WORKFLOW_FILE_BYTES,
        });
    }
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let def = poimen_workflow::parse(&bytes, format, &path.to_string_lossy())?;
    let version = poimen_workflow::version_of(&def);
    Ok(Loaded {
        path: path.to_owned(),
        def,
        version,
    })
}

/// The plan of a validated workflow: its shape (as the validator computed
/// it, the order the executor runs) with each step's resolved actions.
fn plan_of(v: &Validated) -> Plan {
    let def = v.def();
    let shape = v.shape();
    let planned = |i: usize| -> PlannedStep {
        let s = &def.steps[i];
        let tool = match &s.kind {
            StepKind::Tool(t) => v.tool(&t.tool).cloned(),
            _ => None,
        };
        PlannedStep {
            id: s.id.clone(),
            kind: s.kind.name(),
            owner: shape.owner(i).map(|o| shape.id(o).clone()),
            runs: shape
                .owned(i)
                .iter()
                .map(|&o| shape.id(o).clone())
                .collect(),
            tool,
            verifiers: s
                .verify
                .iter()
                .filter_map(|r| v.verifier(&r.verifier).cloned())
                .collect(),
            sub_workflow: v.sub_workflow(&s.id).map(|c| c.version()),
            max_attempts: s.retry.max_attempts,
            timeout_ms: s.effective_timeout().0,
        }
    };
    let mut steps = Vec::new();
    for &top in shape.order() {
        steps.push(planned(top));
        // Each step is followed by the steps it owns, depth first.
        steps.extend(shape.owned_closure(top).into_iter().map(planned));
    }
    let loops = shape
        .back_edges()
        .filter_map(|b| {
            let t = &def.transitions[b.transition];
            t.max_iterations
                .map(|m| (t.from.clone(), t.to.clone(), m.get()))
        })
        .collect();
    Plan {
        workflow: def.id.clone(),
        version: v.version(),
        steps,
        loops,
        eligibility: v.eligibility().clone(),
        long_lived: v.is_long_lived(),
    }
}
