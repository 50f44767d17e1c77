//! `poimen::Host`: the embedding API. One value that loads, validates,
//! publishes, plans and runs workflows, and gives operators and judges their
//! ways back into stopped runs — what the CLI and the MCP server are built on.
//!
//! It wires the crates together (store, sandbox, executor, model provider)
//! and translates their errors into one typed [`Error`]. It exposes no
//! wasmtime, SQLite or tokio-internal types.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use poimen_executor::{
    JudgmentSubmission, ModelProvider, Reconciliation, StartOptions, SystemClock,
};
use poimen_store::{
    JudgmentRecord, MemoryStore, RunId, RunRecord, SqliteStore, Store, StoreError, VersionRecord,
    WorkflowSummary,
};
use poimen_workflow::{
    EligibilityReport, Format, StepId, StepKind, Validated, ValidationError, VersionPrefix,
    WorkflowDef, WorkflowId, WorkflowVersion,
};
use serde::Serialize;
use serde_json::Value;

use crate::loader::{CheckError, check};
use crate::wiring::Wiring;

pub use poimen_executor::model::{EffortMode, OpenAiConfig, Rule};
pub use poimen_executor::{Episode, RunOutcome};
pub use poimen_store::RunStatus;

/// Largest workflow file read from disk (the front end has its own bound too).
pub const MAX_WORKFLOW_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Everything that can go wrong, by kind. Each message says what went wrong,
/// where, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, over the {limit}-byte limit for a workflow file")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error(
        "{path}: the file name must end in .yaml, .yml or .json so poimen knows how to read it"
    )]
    UnknownFormat { path: PathBuf },
    #[error(transparent)]
    Parse(#[from] poimen_workflow::ParseError),
    #[error("workflow `{workflow}` is invalid: {} problem(s); {}", .errors.len(), first(.errors))]
    Invalid {
        workflow: String,
        errors: Vec<ValidationError>,
    },
    #[error("{what} `{given}` was not found; {hint}")]
    NotFound {
        what: &'static str,
        given: String,
        hint: String,
    },
    #[error("`{given}` is not a workflow file or a version: {detail}")]
    BadTarget { given: String, detail: String },
    #[error("the input is not valid JSON: {0}")]
    BadInput(String),
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Start(#[from] poimen_executor::StartError),
    #[error(transparent)]
    Run(#[from] poimen_executor::RunError),
    #[error(transparent)]
    Operator(#[from] poimen_executor::OperatorError),
    #[error(transparent)]
    Judgment(#[from] poimen_executor::JudgmentError),
    #[error("the plugin host could not start: {0}")]
    Sandbox(#[from] poimen_sandbox::BuildError),
    #[error("plugin: {0}")]
    Plugin(#[from] poimen_sandbox::LoadError),
    #[error("stored version {version} cannot be read back: {detail}")]
    Unreadable {
        version: WorkflowVersion,
        detail: String,
    },
    #[error(transparent)]
    Shadow(#[from] crate::shadow::ShadowError),
    #[error(
        "run {run} is still {status} after {}; wait longer (--timeout) or look at it with `poimen status {run}`",
        humantime_ms(.after)
    )]
    Timeout {
        run: RunId,
        status: RunStatus,
        after: std::time::Duration,
    },
}

fn humantime_ms(d: &std::time::Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn first(errors: &[ValidationError]) -> String {
    errors.first().map(|e| e.to_string()).unwrap_or_default()
}

impl From<CheckError> for Error {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Store(s) => Error::Store(s),
            CheckError::Unreadable {
                version, detail, ..
            } => Error::Unreadable { version, detail },
            CheckError::Invalid(errors) => Error::Invalid {
                workflow: String::new(),
                errors,
            },
        }
    }
}

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

/// Builds a [`Host`].
#[derive(Debug, Clone)]
#[must_use]
pub struct HostBuilder {
    store: StoreChoice,
    plugin_dirs: Vec<PathBuf>,
    policy: Option<PathBuf>,
    bundled: bool,
    cache_dir: Option<PathBuf>,
    model: ModelChoice,
    host_id: String,
    lease_ttl: std::time::Duration,
}

impl Default for HostBuilder {
    fn default() -> Self {
        HostBuilder {
            store: StoreChoice::Memory,
            plugin_dirs: Vec::new(),
            policy: None,
            bundled: true,
            cache_dir: None,
            model: ModelChoice::None,
            host_id: "local".to_owned(),
            lease_ttl: std::time::Duration::from_millis(
                poimen_executor::DEFAULT_LEASE_TTL_MS as u64,
            ),
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

    /// Keep versions and runs in a store the embedder opened (any
    /// [`Store`] implementation).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
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
    /// baseline and `scratch` is granted.
    pub fn policy_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy = Some(path.into());
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

    /// Who answers model steps.
    pub fn model(mut self, model: ModelChoice) -> Self {
        self.model = model;
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
            StoreChoice::Sqlite(path) => Arc::new(SqliteStore::open(path.clone()).await?),
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
        if let Some(p) = &self.policy {
            sb = sb.policy_file(p.clone());
        }
        for d in &self.plugin_dirs {
            sb = sb.plugin_dir(d.clone());
        }
        if self.bundled {
            for b in plugin_artifacts::BUNDLED {
                sb = sb.component_bytes(format!("bundled:{}", b.ident), b.bytes);
            }
        }
        let sandbox = sb.build().await?;
        let models: Arc<dyn ModelProvider> = match self.model {
            ModelChoice::None => Arc::new(crate::NoModel),
            ModelChoice::Scripted(rules) => {
                Arc::new(poimen_executor::model::ScriptedProvider::new(rules))
            }
            ModelChoice::OpenAi(cfg) => {
                Arc::new(poimen_executor::model::OpenAiCompatible::new(cfg))
            }
        };
        let wiring = Wiring::new(
            store,
            sandbox,
            models.clone(),
            Arc::new(SystemClock),
            poimen_executor::ExecutorConfig {
                host_id: self.host_id.clone(),
                lease_ttl_ms: i64::try_from(self.lease_ttl.as_millis())
                    .unwrap_or(i64::MAX)
                    .max(1),
            },
        );
        Ok(Host {
            inner: Arc::new(Inner { wiring, models }),
        })
    }
}

struct Inner {
    wiring: Wiring,
    models: Arc<dyn ModelProvider>,
}

impl Inner {
    fn store(&self) -> &Arc<dyn Store> {
        &self.wiring.store
    }

    fn sandbox(&self) -> &poimen_sandbox::PluginHost {
        &self.wiring.sandbox
    }

    fn executor(&self) -> &poimen_executor::Executor {
        &self.wiring.executor
    }
}

/// The poimen host.
#[derive(Clone)]
pub struct Host {
    inner: Arc<Inner>,
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
}

impl RunOptions {
    /// A run under an idempotency key.
    pub fn key(key: impl Into<String>) -> RunOptions {
        RunOptions {
            idempotency_key: Some(key.into()),
            tenant: None,
        }
    }

    fn into_start(self) -> StartOptions {
        StartOptions {
            idempotency_key: self.idempotency_key,
            tenant: self
                .tenant
                .map(poimen_executor::TenantId)
                .unwrap_or_default(),
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

/// Everything recorded about a run's effects.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    pub run: RunRecord,
    pub intents: Vec<poimen_store::IntentRecord>,
    /// The `tool_called` events, with their hostcall records.
    pub tool_calls: Vec<Value>,
    /// Verifier verdicts, with their hostcall records.
    pub verdicts: Vec<Value>,
    /// Intent triples that are incomplete (a call without Pending,
    /// Dispatched and a final phase): empty unless something bypassed the
    /// intent wrapper or a run is still in flight.
    pub incomplete: Vec<String>,
}

impl Host {
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// Reads and parses a workflow file (`.yaml`, `.yml` or `.json`).
    pub fn load_file(&self, path: &Path) -> Result<Loaded, Error> {
        load_file(path)
    }

    /// Validates a definition against this host's registries and store.
    pub async fn validate(&self, def: &WorkflowDef) -> Result<Validated, Error> {
        check(&**self.inner.store(), self.inner.sandbox(), def)
            .await
            .map_err(|e| match Error::from(e) {
                Error::Invalid { errors, .. } => Error::Invalid {
                    workflow: def.id.to_string(),
                    errors,
                },
                other => other,
            })
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
                now_ms(),
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
        let prefix = VersionPrefix::parse(text).map_err(|e| Error::BadTarget {
            given: text.to_owned(),
            detail: e.to_string(),
        })?;
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
    pub async fn version(&self, text: &str) -> Result<(VersionRecord, WorkflowDef), Error> {
        let v = self.resolve_version(text).await?;
        let record = self
            .inner
            .store()
            .version(&v)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "version",
                given: text.to_owned(),
                hint: "`poimen versions WORKFLOW_ID` lists published versions".into(),
            })?;
        let def =
            poimen_workflow::from_canonical(&record.canonical).map_err(|e| Error::Unreadable {
                version: v,
                detail: e.to_string(),
            })?;
        Ok((record, def))
    }

    /// Every version of a workflow, with parents, in publish order.
    pub async fn versions(&self, workflow: &str) -> Result<Vec<VersionRecord>, Error> {
        let list = self
            .inner
            .store()
            .versions_of(&WorkflowId::from(workflow))
            .await?;
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
                workflow,
                known.iter().map(String::as_str),
            );
            return Err(Error::NotFound {
                what: "workflow",
                given: workflow.to_owned(),
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
                let (_, def) = self.version(text).await?;
                self.validate(&def).await
            }
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
        let v = self.prepare(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        Ok(self
            .inner
            .executor()
            .run(runnable, input, opts.into_start())
            .await?)
    }

    /// Starts a run and returns its id without waiting for it (the run is
    /// driven on a background task).
    pub async fn start(
        &self,
        target: &Target,
        input: Value,
        opts: RunOptions,
    ) -> Result<RunId, Error> {
        let v = self.prepare(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        let started = self
            .inner
            .executor()
            .start(runnable, input, opts.into_start())
            .await?;
        let exec = self.inner.executor().clone();
        let (run, id) = (started.run.clone(), started.run.clone());
        tokio::spawn(async move {
            if let Err(e) = exec.drive_started(started).await {
                tracing::warn!(run = %run, error = %e, "background run stopped with an error");
            }
        });
        Ok(id)
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
        let v = self.prepare(target).await?;
        let runnable = self.inner.wiring.loader.runnable(v);
        let started = self
            .inner
            .executor()
            .enqueue(runnable, input, opts.into_start())
            .await?;
        Ok(started.run)
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
        run: &str,
        timeout: Option<std::time::Duration>,
    ) -> Result<RunRecord, Error> {
        let id = self.run_id(run)?;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            let rec = self.inner.executor().status(&id).await?;
            if !matches!(rec.status, RunStatus::Running | RunStatus::Queued) {
                return Ok(rec);
            }
            if let Some(d) = deadline
                && tokio::time::Instant::now() >= d
            {
                return Err(Error::Timeout {
                    run: id,
                    status: rec.status,
                    after: timeout.unwrap_or_default(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    fn run_id(&self, run: &str) -> Result<RunId, Error> {
        RunId::parse(run).map_err(|e| Error::NotFound {
            what: "run",
            given: run.to_owned(),
            hint: format!("{e}; `poimen status` lists runs"),
        })
    }

    /// A run's record and its state refolded from the episode.
    pub async fn status(&self, run: &str) -> Result<(RunRecord, poimen_executor::RunState), Error> {
        let id = self.run_id(run)?;
        let rec = self.inner.executor().status(&id).await?;
        let state = self.inner.executor().state(&id).await?;
        Ok((rec, state))
    }

    /// Recent runs, newest first.
    pub async fn runs(&self, limit: u32, tenant: Option<&str>) -> Result<Vec<RunRecord>, Error> {
        Ok(self
            .inner
            .store()
            .list_runs(poimen_store::RunFilter {
                limit: Some(limit),
                tenant: tenant.map(str::to_owned),
                ..Default::default()
            })
            .await?)
    }

    /// A run's episode.
    pub async fn episode(&self, run: &str) -> Result<Episode, Error> {
        let id = self.run_id(run)?;
        Ok(self.inner.executor().episode(&id).await?)
    }

    /// A run's intents, tool calls and verdicts with their hostcall records.
    pub async fn audit(&self, run: &str) -> Result<Audit, Error> {
        let id = self.run_id(run)?;
        let rec = self.inner.executor().status(&id).await?;
        let intents = self.inner.executor().intents(&id).await?;
        let episode = self.inner.executor().episode(&id).await?;
        let mut tool_calls = Vec::new();
        let mut verdicts = Vec::new();
        for r in &episode.events {
            match &r.event {
                e @ poimen_executor::EpisodeEvent::ToolCalled { .. } => {
                    tool_calls.push(e.body());
                }
                e @ poimen_executor::EpisodeEvent::Verified { .. } => {
                    verdicts.push(e.body());
                }
                _ => {}
            }
        }
        let mut phases: BTreeMap<(String, u32, u32), Vec<poimen_store::IntentPhase>> =
            BTreeMap::new();
        for i in &intents {
            phases
                .entry((i.step.to_string(), i.iteration, i.attempt))
                .or_default()
                .push(i.phase);
        }
        let incomplete = phases
            .iter()
            .filter(|(_, ps)| {
                use poimen_store::IntentPhase::*;
                let reconciled = ps.first() == Some(&Committed) || ps.first() == Some(&Failed);
                !(reconciled
                    || (ps.contains(&Pending)
                        && ps.contains(&Dispatched)
                        && ps
                            .last()
                            .is_some_and(|p| matches!(p, Committed | Failed | Abandoned))))
            })
            .map(|((s, it, at), ps)| {
                format!(
                    "step `{s}` iteration {it} attempt {at}: {}",
                    ps.iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(" → ")
                )
            })
            .collect();
        Ok(Audit {
            run: rec,
            intents,
            tool_calls,
            verdicts,
            incomplete,
        })
    }

    /// Drives a stopped run again (see [`poimen_executor::Executor::resume`]).
    pub async fn resume(&self, run: &str) -> Result<RunOutcome, Error> {
        let id = self.run_id(run)?;
        Ok(self.inner.executor().resume(&id).await?)
    }

    /// Cancels a run.
    pub async fn cancel(&self, run: &str) -> Result<RunRecord, Error> {
        let id = self.run_id(run)?;
        Ok(self
            .inner
            .executor()
            .cancel(&id, "cancelled by an operator")
            .await?)
    }

    /// Runs a failed run again from a step (by default the one that failed).
    pub async fn retry(&self, run: &str, from: Option<&str>) -> Result<RunOutcome, Error> {
        let id = self.run_id(run)?;
        Ok(self
            .inner
            .executor()
            .retry(&id, from.map(StepId::from))
            .await?)
    }

    /// Records an operator's decision on a tool call with an unknown outcome.
    pub async fn reconcile(
        &self,
        run: &str,
        step: &str,
        decision: Reconciliation,
    ) -> Result<RunOutcome, Error> {
        let id = self.run_id(run)?;
        Ok(self
            .inner
            .executor()
            .reconcile(&id, &StepId::from(step), decision)
            .await?)
    }

    /// Open judgment requests.
    pub async fn judgments(&self) -> Result<Vec<JudgmentRecord>, Error> {
        Ok(self.inner.executor().open_judgments().await?)
    }

    /// One judgment request.
    pub async fn judgment(&self, id: &str) -> Result<JudgmentRecord, Error> {
        Ok(self.inner.executor().judgment(id).await?)
    }

    /// Submits a judge's answer.
    pub async fn submit_judgment(
        &self,
        id: &str,
        submission: JudgmentSubmission,
    ) -> Result<RunOutcome, Error> {
        Ok(self
            .inner
            .executor()
            .submit_judgment(id, submission)
            .await?)
    }

    /// Drives every run this host left in flight.
    pub async fn recover(&self) -> Result<Vec<RunOutcome>, Error> {
        Ok(self.inner.executor().recover().await?)
    }

    /// Invokes one tool directly through the sandbox (`poimen plugin call`):
    /// the output and the hostcall record, or the error and the record.
    pub async fn call_tool(
        &self,
        tool: poimen_workflow::ToolRef,
        args: Value,
        idempotency_key: String,
    ) -> Result<(Value, Value), (String, Value)> {
        let inv = self
            .inner
            .sandbox()
            .invoke_tool(poimen_sandbox::ToolRequest::new(
                tool,
                args,
                idempotency_key,
            ))
            .await;
        let record = inv.record.to_json();
        match inv.outcome {
            Ok(v) => Ok((v, record)),
            Err(e) => Err((e.to_string(), record)),
        }
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
                let (_, def) = self.version(text).await?;
                self.validate(&def).await?
            }
        };
        let (_, baseline_def) = self.version(baseline).await?;
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
        let mut out = Vec::new();
        for w in self.inner.store().workflows().await? {
            let (_, def) = self.version(&w.latest.to_string()).await?;
            if def.tool.is_some() {
                out.push((w.latest, def));
            }
        }
        Ok(out)
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
