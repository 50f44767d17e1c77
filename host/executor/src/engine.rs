//! The executor: starting, driving, resuming, cancelling and retrying runs,
//! and the operator's and judge's ways back into a stopped run.
//!
//! It owns the run lifecycle and the registry of runs this host is driving.
//! Everything it touches outside memory goes through traits: the `Store`,
//! the `ToolHost`, the `ModelProvider`, the `Clock`, and the [`Armory`]
//! that turns a published version into a validated, ready-to-run workflow.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use store::{
    CreateRun, Durability, IntentPhase, IntentRecord, JudgmentStatus, JudgmentWrite, NewRun, RunId,
    RunRecord, RunStatus, Store, StoreError,
};
use workflow::{StepId, StepKind, WorkflowVersion};

use crate::effects::{Clock, Failure, FailureClass, ModelProvider, ToolHost};
use crate::episode::{CallOutcome, Episode, EpisodeEvent, ParentLink, PinnedTool, Reconciliation};
use crate::hash::{canonical_json, hash_json};
use crate::plan::Armed;
use crate::run::{RunCtx, RunOutcome, check_schema};
use crate::scope::{RunScope, TenantId};
use crate::state::{RunState, refold};

/// Deepest chain of sub-workflow runs the kernel executes. The validator
/// rejects deeper graphs at load; this is the interpreter's own guard.
pub const MAX_SUBWORKFLOW_DEPTH: u32 = 8;

/// Turns a published version into a validated, ready-to-run workflow
/// (loaded from the store and validated against the current registries).
#[async_trait]
pub trait Armory: Send + Sync {
    async fn arm(&self, version: &WorkflowVersion) -> Result<Arc<Armed>, Failure>;
}

/// Errors of the executor's operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error("the input does not match the `inputs` schema of workflow `{workflow}`: {problems}")]
    InvalidInput { workflow: String, problems: String },
    #[error("run {0} does not exist; `poimen status` lists runs")]
    UnknownRun(String),
    #[error("cannot start workflow `{workflow}`: {cause}")]
    Unavailable { workflow: String, cause: Failure },
    #[error("sub-workflow nesting is deeper than the kernel's bound of {max}")]
    TooDeep { max: u32 },
    #[error("run {run} is {status:?}; {what}")]
    WrongStatus {
        run: String,
        status: RunStatus,
        what: String,
    },
    #[error("step `{step}` of run {run}: {what}")]
    WrongStep {
        run: String,
        step: String,
        what: String,
    },
    #[error("judgment {0} does not exist; `poimen judgment list` shows the open ones")]
    UnknownJudgment(String),
    #[error("judgment {id} was already answered; the answer stands and the run has moved on")]
    JudgmentClosed { id: String },
    #[error(
        "judgment {id}: the submitted request hash {got} is not the request's {expected}; fetch the request again with `poimen judgment show {id}`"
    )]
    RequestHashMismatch {
        id: String,
        expected: String,
        got: String,
    },
    #[error("judgment {id}: the result does not match the request's result schema: {problems}")]
    ResultSchema { id: String, problems: String },
    #[error("judgment {id}: the request expects {field} `{expected}`, the submission says `{got}`")]
    ExecutorMismatch {
        id: String,
        field: &'static str,
        expected: String,
        got: String,
    },
    #[error(
        "judgment {id}: the submission's provenance must name the judge (`provenance.judge`) — {detail}"
    )]
    Provenance { id: String, detail: String },
    #[error("{}", store_failed(.0))]
    Store(#[from] StoreError),
    #[error("run {run}'s episode cannot be read: {detail}")]
    Episode { run: String, detail: String },
    #[error(
        "workflow `{workflow}`{} already has {} active run(s) ({}), its `concurrency.max_runs` is {max_runs} and `on_overflow` is drop: the run was refused; wait for one to finish, or cancel one with `poimen cancel RUN`",
        key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default(),
        active.len(),
        active.join(", ")
    )]
    Overflow {
        workflow: String,
        key: Option<String>,
        max_runs: u32,
        active: Vec<String>,
    },
    #[error(
        "the `key` template of workflow `{workflow}` cannot be rendered from the input: {detail}"
    )]
    Key { workflow: String, detail: String },
}

/// A store error in words: a refusal (an idempotency conflict) stands on
/// its own; anything else is the store failing.
fn store_failed(e: &StoreError) -> String {
    match e {
        StoreError::IdempotencyConflict(_) => e.to_string(),
        other => format!("the store failed: {other}"),
    }
}

/// The rendered `key` of a run of `def` on `input`.
fn render_key(def: &workflow::WorkflowDef, input: &Value) -> Result<String, ExecError> {
    let Some(template) = &def.key else {
        return Err(ExecError::Key {
            workflow: def.id.to_string(),
            detail: "`concurrency.scope: key` needs a `key` template".into(),
        });
    };
    let ctx = serde_json::json!({ "inputs": input });
    crate::render::render_text(&template.0, &ctx)
        .map(|(text, _)| text)
        .map_err(|e| ExecError::Key {
            workflow: def.id.to_string(),
            detail: e.to_string(),
        })
}

/// Options of a new run.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// The same (version, input) under this key returns the existing run;
    /// another input under it is refused.
    pub idempotency_key: Option<String>,
    pub tenant: TenantId,
}

/// A run that was started, or found under its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub run: RunId,
    /// True when the idempotency key named an existing run.
    pub existing: bool,
}

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

/// Configuration of an executor.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// This host's id (recorded as run owner).
    pub host_id: String,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            host_id: "local".to_owned(),
        }
    }
}

pub(crate) struct Inner {
    pub store: Arc<dyn Store>,
    pub memory: Arc<dyn Store>,
    pub tools: Arc<dyn ToolHost>,
    pub models: Arc<dyn ModelProvider>,
    pub clock: Arc<dyn Clock>,
    pub armory: Arc<dyn Armory>,
    pub config: ExecutorConfig,
    active: std::sync::Mutex<HashMap<String, RunScope>>,
    /// One admission at a time per workflow, so two starts cannot both see
    /// the last free slot.
    admission: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// How often a queued start looks for a free slot again.
const QUEUE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs workflows.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("host", &self.inner.config.host_id)
            .finish()
    }
}

impl Executor {
    /// Arms the version a run started on, from its refolded state.
    async fn arm_run(&self, run: &RunId, state: &RunState) -> Result<Arc<Armed>, ExecError> {
        let version = state.version.ok_or_else(|| ExecError::Episode {
            run: run.to_string(),
            detail: "no run_started event".into(),
        })?;
        self.inner
            .armory
            .arm(&version)
            .await
            .map_err(|cause| ExecError::Unavailable {
                workflow: state
                    .workflow_id
                    .as_ref()
                    .map(|w| w.to_string())
                    .unwrap_or_default(),
                cause,
            })
    }

    /// An executor over a durable store (and an in-memory one for
    /// `durable: false` workflows).
    pub fn new(
        store: Arc<dyn Store>,
        tools: Arc<dyn ToolHost>,
        models: Arc<dyn ModelProvider>,
        clock: Arc<dyn Clock>,
        armory: Arc<dyn Armory>,
        config: ExecutorConfig,
    ) -> Executor {
        Executor {
            inner: Arc::new(Inner {
                store,
                memory: Arc::new(store::MemoryStore::new()),
                tools,
                models,
                clock,
                armory,
                config,
                active: std::sync::Mutex::new(HashMap::new()),
                admission: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Starts a run and drives it until it ends or must wait.
    pub async fn run(
        &self,
        armed: Arc<Armed>,
        input: Value,
        opts: StartOptions,
    ) -> Result<RunOutcome, ExecError> {
        let started = self.start(armed, input, opts).await?;
        self.resume(&started.run).await
    }

    /// Creates a run (without driving it). With an idempotency key that
    /// already names a run of the same version and input, returns that run.
    pub async fn start(
        &self,
        armed: Arc<Armed>,
        input: Value,
        opts: StartOptions,
    ) -> Result<Started, ExecError> {
        let _admitted = self
            .admit(&armed, &input, opts.idempotency_key.as_deref())
            .await?;
        self.inner
            .create(armed, input, None, opts.idempotency_key)
            .await
    }

    /// Applies the workflow's `concurrency` to a new top-level run: counts
    /// the active (not final) runs in its scope — all runs of the workflow,
    /// or those whose rendered `key` equals this input's — in the stores,
    /// so the count survives restarts; then queues, refuses or replaces.
    /// Returns the admission guard, to hold until the run is created.
    async fn admit(
        &self,
        armed: &Armed,
        input: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, ExecError> {
        let def = &armed.def;
        let Some(max) = def.concurrency.max_runs else {
            return Ok(None);
        };
        let key = match def.concurrency.scope {
            workflow::ConcurrencyScope::Workflow => None,
            workflow::ConcurrencyScope::Key => Some(render_key(def, input)?),
        };
        let lock = self
            .inner
            .admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(def.id.to_string())
            .or_default()
            .clone();
        let guard = lock.lock_owned().await;
        loop {
            let mut active = Vec::new();
            for store in [&self.inner.store, &self.inner.memory] {
                let runs = store
                    .list_runs(store::RunFilter {
                        workflow_id: Some(def.id.clone()),
                        ..store::RunFilter::default()
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
                workflow::Overflow::Drop => {
                    return Err(ExecError::Overflow {
                        workflow: def.id.to_string(),
                        key,
                        max_runs: max,
                        active: active.iter().map(|r| r.id.to_string()).collect(),
                    });
                }
                workflow::Overflow::Replace => {
                    let excess = active.len() + 1 - max as usize;
                    for r in active.iter().take(excess) {
                        self.cancel(
                            &r.id,
                            "replaced by a newer run (concurrency.on_overflow: replace)",
                        )
                        .await?;
                    }
                }
                workflow::Overflow::Queue => {
                    self.inner.clock.sleep(QUEUE_POLL).await;
                }
            }
        }
    }

    /// Finds which store holds a run.
    async fn locate(&self, run: &RunId) -> Result<(Arc<dyn Store>, RunRecord), ExecError> {
        self.inner.locate(run).await
    }

    /// A run's record.
    pub async fn status(&self, run: &RunId) -> Result<RunRecord, ExecError> {
        Ok(self.locate(run).await?.1)
    }

    /// A run's episode.
    pub async fn episode(&self, run: &RunId) -> Result<Episode, ExecError> {
        let (store, _) = self.locate(run).await?;
        load_episode(&*store, run).await
    }

    /// A run's state, refolded from its episode.
    pub async fn state(&self, run: &RunId) -> Result<RunState, ExecError> {
        let episode = self.episode(run).await?;
        refold(&episode).map_err(|e| ExecError::Episode {
            run: run.to_string(),
            detail: e.to_string(),
        })
    }

    /// A run's intent records.
    pub async fn intents(&self, run: &RunId) -> Result<Vec<IntentRecord>, ExecError> {
        let (store, _) = self.locate(run).await?;
        Ok(store.intents(run).await?)
    }

    /// Drives a run from where its episode ends: a run that stopped with its
    /// host is recovered; a waiting or blocked run whose cause was not
    /// resolved stays as it is; a finished run is returned as is.
    pub async fn resume(&self, run: &RunId) -> Result<RunOutcome, ExecError> {
        let root = self.inner.root_of(run).await?;
        let outcome = self.inner.clone().drive_root(&root).await?;
        if &root == run {
            return Ok(outcome);
        }
        // A child run: report its own state.
        let (_, rec) = self.locate(run).await?;
        let state = self.state(run).await?;
        Ok(RunOutcome {
            run: run.clone(),
            status: rec.status,
            output: state.output.clone(),
            reason: rec.reason,
            state,
        })
    }

    /// Cancels a run: in-flight guests are interrupted, branches stopped,
    /// child runs cancelled, and no intent is left dangling.
    pub async fn cancel(&self, run: &RunId, reason: &str) -> Result<RunRecord, ExecError> {
        let scope = self
            .inner
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run.as_str())
            .cloned();
        if let Some(scope) = scope {
            scope.cancel_run();
            // The driver records the cancellation; wait for it to land.
            for _ in 0..500 {
                let rec = self.status(run).await?;
                if rec.status.is_terminal() {
                    return Ok(rec);
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            return self.status(run).await;
        }
        self.inner.cancel_stopped(run, reason).await?;
        self.status(run).await
    }

    /// Goes again from a step of a finished run (by default the step that
    /// failed): that step and every later top-level step run as new
    /// iterations; the history stays in the episode.
    pub async fn retry(&self, run: &RunId, from: Option<StepId>) -> Result<RunOutcome, ExecError> {
        let (store, rec) = self.locate(run).await?;
        if !rec.status.is_terminal() {
            return Err(ExecError::WrongStatus {
                run: run.to_string(),
                status: rec.status,
                what: "only a finished run can be retried; `poimen resume` continues a stopped one"
                    .into(),
            });
        }
        let state = self.state(run).await?;
        let armed = self.arm_run(run, &state).await?;
        let topo = &armed.shape.topo;
        let from = match from {
            Some(f) => {
                if !topo.contains(&f) {
                    return Err(ExecError::WrongStep {
                        run: run.to_string(),
                        step: f.to_string(),
                        what: format!(
                            "it is not a top-level step of the workflow; top-level steps: {}",
                            topo.iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
                f
            }
            None => topo
                .iter()
                .find(|s| {
                    state.steps.get(*s).map(|x| x.status)
                        != Some(crate::episode::StepStatus::Completed)
                })
                .cloned()
                .ok_or_else(|| ExecError::WrongStatus {
                    run: run.to_string(),
                    status: rec.status,
                    what: "every step completed; name a step with --from to run again from it"
                        .into(),
                })?,
        };
        let start = topo.iter().position(|s| *s == from).unwrap_or(0);
        let mut reset: Vec<StepId> = Vec::new();
        for top in &topo[start..] {
            reset.push(top.clone());
            collect_owned(&armed, top, &mut reset);
        }
        let ctx = RunCtx::new(
            self.inner.clone(),
            store.clone(),
            run.clone(),
            armed,
            RunScope::root(TenantId::default(), run.to_string()),
            0,
            state,
            &[],
        );
        ctx.record(
            vec![EpisodeEvent::RunRetried { from, reset }],
            Vec::new(),
            Some((RunStatus::Running, None, None)),
            Durability::Sync,
        )
        .await
        .map_err(|h| halt_error(run, h))?;
        self.resume(run).await
    }

    /// Records an operator's decision on a blocked tool call and resumes.
    pub async fn reconcile(
        &self,
        run: &RunId,
        step: &StepId,
        decision: Reconciliation,
    ) -> Result<RunOutcome, ExecError> {
        let (store, rec) = self.locate(run).await?;
        if rec.status != RunStatus::Blocked {
            return Err(ExecError::WrongStatus {
                run: run.to_string(),
                status: rec.status,
                what: "only a blocked run takes a reconciliation".into(),
            });
        }
        let state = self.state(run).await?;
        let intents = store.intents(run).await?;
        // The open intent: dispatched, never closed.
        let mut open: BTreeMap<(u32, u32), Vec<&IntentRecord>> = BTreeMap::new();
        for i in intents.iter().filter(|i| &i.step == step) {
            open.entry((i.iteration, i.attempt)).or_default().push(i);
        }
        let Some(((iteration, attempt), phases)) = open.into_iter().rev().find(|(_, ps)| {
            ps.last()
                .is_some_and(|p| p.phase == IntentPhase::Dispatched)
        }) else {
            let blocked: Vec<String> = state
                .steps
                .iter()
                .filter(|(_, s)| s.status == crate::episode::StepStatus::Running)
                .map(|(id, _)| id.to_string())
                .collect();
            return Err(ExecError::WrongStep {
                run: run.to_string(),
                step: step.to_string(),
                what: format!(
                    "it has no dispatched tool call with an unknown outcome; steps in flight: {}",
                    if blocked.is_empty() {
                        "none".to_owned()
                    } else {
                        blocked.join(", ")
                    }
                ),
            });
        };
        let last = phases
            .last()
            .copied()
            .cloned()
            .ok_or_else(|| ExecError::Episode {
                run: run.to_string(),
                detail: "empty intent list".into(),
            })?;
        let armed = self.arm_run(run, &state).await?;
        let (outcome, phase, output_hash, error) = match &decision {
            Reconciliation::Committed { output } => {
                let h = hash_json(output);
                (
                    CallOutcome::Ok {
                        output: output.clone(),
                        output_hash: h.clone(),
                    },
                    IntentPhase::Committed,
                    Some(h),
                    None,
                )
            }
            Reconciliation::Failed { reason } => (
                CallOutcome::Err {
                    failure: Failure::new(
                        FailureClass::Failed,
                        format!("reconciled as failed: {reason}"),
                    ),
                },
                IntentPhase::Failed,
                None,
                Some(reason.clone()),
            ),
        };
        let now = self.inner.clock.now_ms();
        let record = serde_json::json!({"reconciled_by": "operator", "decision": decision});
        let identity = crate::effects::ToolIdentity {
            name: last.tool.clone(),
            version: last.tool_version.clone(),
            digest: last.digest.clone(),
        };
        let final_intent = IntentRecord {
            phase,
            output_hash,
            error,
            record: Some(record.clone()),
            at: now,
            ..last.clone()
        };
        let ctx = RunCtx::new(
            self.inner.clone(),
            store.clone(),
            run.clone(),
            armed,
            RunScope::root(TenantId::default(), run.to_string()),
            0,
            state,
            &intents,
        );
        ctx.record(
            vec![
                EpisodeEvent::Reconciled {
                    step: step.clone(),
                    iteration,
                    attempt,
                    decision: decision.clone(),
                },
                EpisodeEvent::ToolCalled {
                    step: step.clone(),
                    iteration,
                    attempt,
                    tool: identity,
                    effect: last.effect,
                    args: Value::Null,
                    args_hash: last.args_hash.clone(),
                    idempotency_key: last.idempotency_key.clone(),
                    capabilities: Vec::new(),
                    record,
                    outcome,
                    reconciled: true,
                },
                EpisodeEvent::RunResumed {
                    reason: "reconciled by an operator".into(),
                },
            ],
            vec![final_intent],
            Some((RunStatus::Running, None, None)),
            Durability::Sync,
        )
        .await
        .map_err(|h| halt_error(run, h))?;
        self.inner
            .unblock_ancestors(run, RunStatus::Blocked, "a child run was reconciled")
            .await?;
        self.resume(run).await
    }

    /// Validates a judge's answer and, when it holds, records it and resumes
    /// the run. Any mismatch is a specific error and the run stays waiting.
    pub async fn submit_judgment(
        &self,
        id: &str,
        submission: JudgmentSubmission,
    ) -> Result<RunOutcome, ExecError> {
        let judgment = self
            .inner
            .find_judgment(id)
            .await?
            .ok_or_else(|| ExecError::UnknownJudgment(id.to_owned()))?;
        let (store, record) = judgment;
        if record.status != JudgmentStatus::Open {
            return Err(ExecError::JudgmentClosed { id: id.to_owned() });
        }
        if submission.request_hash != record.request_hash {
            return Err(ExecError::RequestHashMismatch {
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
        check_schema(&schema, &submission.result).map_err(|problems| ExecError::ResultSchema {
            id: id.to_owned(),
            problems,
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
                return Err(ExecError::ExecutorMismatch {
                    id: id.to_owned(),
                    field,
                    expected: expected.clone(),
                    got: got.clone().unwrap_or_else(|| "(none)".into()),
                });
            }
        }
        match submission.provenance.get("judge") {
            Some(Value::String(j)) if !j.trim().is_empty() => {}
            _ => {
                return Err(ExecError::Provenance {
                    id: id.to_owned(),
                    detail: "give an object such as {\"judge\": \"alice@example.com\", \"method\": \"manual review\"}".into(),
                });
            }
        }
        let run = record.run.clone();
        let state = self.state(&run).await?;
        let armed = self.arm_run(&run, &state).await?;
        let ctx = RunCtx::new(
            self.inner.clone(),
            store.clone(),
            run.clone(),
            armed,
            RunScope::root(TenantId::default(), run.to_string()),
            0,
            state,
            &[],
        );
        let now = self.inner.clock.now_ms();
        ctx.commit(crate::run::Batch {
            events: vec![
                EpisodeEvent::JudgmentReceived {
                    step: record.step.clone(),
                    iteration: record.iteration,
                    request_id: id.to_owned(),
                    result_hash: hash_json(&submission.result),
                    result: submission.result.clone(),
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
            judgments: vec![JudgmentWrite::Answer {
                id: record.id.clone(),
                result: submission.result,
                at: now,
            }],
            update: Some((RunStatus::Running, None, None)),
            durability: Durability::Sync,
            ..crate::run::Batch::default()
        })
        .await
        .map_err(|h| halt_error(&run, h))?;
        self.inner
            .unblock_ancestors(
                &run,
                RunStatus::WaitingJudgment,
                "a child run's judgment was answered",
            )
            .await?;
        self.resume(&run).await
    }

    /// Open judgment requests of both stores.
    pub async fn open_judgments(&self) -> Result<Vec<store::JudgmentRecord>, ExecError> {
        let mut all = self.inner.store.open_judgments().await?;
        all.extend(self.inner.memory.open_judgments().await?);
        Ok(all)
    }

    /// One judgment request.
    pub async fn judgment(&self, id: &str) -> Result<store::JudgmentRecord, ExecError> {
        self.inner
            .find_judgment(id)
            .await?
            .map(|(_, r)| r)
            .ok_or_else(|| ExecError::UnknownJudgment(id.to_owned()))
    }

    /// Finds the runs this host left in flight and drives them again.
    pub async fn recover(&self) -> Result<Vec<RunOutcome>, ExecError> {
        let runs = self.inner.store.in_flight_runs().await?;
        let mut out = Vec::new();
        for r in runs {
            if r.status == RunStatus::Running && r.parent.is_none() {
                out.push(self.resume(&r.id).await?);
            }
        }
        Ok(out)
    }
}

/// A ULID for a new run id at `now_ms`: time from the executor's clock,
/// the rest random (ids are volatile: nothing hashes or compares them).
fn new_ulid(now_ms: i64) -> ulid::Ulid {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
    ulid::Ulid::from_datetime(at)
}

fn collect_owned(armed: &Armed, id: &StepId, out: &mut Vec<StepId>) {
    let Some(step) = armed.step(id) else { return };
    let owned: Vec<StepId> = match &step.kind {
        StepKind::Parallel(p) => p.branches.clone(),
        StepKind::Conditional(c) => std::iter::once(c.then.clone())
            .chain(c.otherwise.clone())
            .collect(),
        _ => Vec::new(),
    };
    for o in owned {
        if !out.contains(&o) {
            out.push(o.clone());
            collect_owned(armed, &o, out);
        }
    }
}

fn halt_error(run: &RunId, h: crate::run::Halt) -> ExecError {
    match h {
        crate::run::Halt::Store(e) => ExecError::Store(e),
        other => ExecError::Episode {
            run: run.to_string(),
            detail: format!("{other:?}"),
        },
    }
}

async fn load_episode(store: &dyn Store, run: &RunId) -> Result<Episode, ExecError> {
    let stored = store.events(run).await?;
    Episode::from_stored(run.as_str(), &stored).map_err(|e| ExecError::Episode {
        run: run.to_string(),
        detail: e.to_string(),
    })
}

impl Inner {
    async fn locate(&self, run: &RunId) -> Result<(Arc<dyn Store>, RunRecord), ExecError> {
        if let Some(r) = self.store.run(run).await? {
            return Ok((self.store.clone(), r));
        }
        if let Some(r) = self.memory.run(run).await? {
            return Ok((self.memory.clone(), r));
        }
        Err(ExecError::UnknownRun(run.to_string()))
    }

    async fn find_judgment(
        &self,
        id: &str,
    ) -> Result<Option<(Arc<dyn Store>, store::JudgmentRecord)>, ExecError> {
        let Ok(id) = store::JudgmentId::parse(id) else {
            return Ok(None);
        };
        let id = &id;
        if let Some(j) = self.store.judgment(id).await? {
            return Ok(Some((self.store.clone(), j)));
        }
        if let Some(j) = self.memory.judgment(id).await? {
            return Ok(Some((self.memory.clone(), j)));
        }
        Ok(None)
    }

    /// The top-level ancestor of a run.
    async fn root_of(&self, run: &RunId) -> Result<RunId, ExecError> {
        let mut current = run.clone();
        for _ in 0..=MAX_SUBWORKFLOW_DEPTH {
            let (_, rec) = self.locate(&current).await?;
            match rec.parent {
                Some((parent, _)) => current = parent,
                None => return Ok(current),
            }
        }
        Err(ExecError::TooDeep {
            max: MAX_SUBWORKFLOW_DEPTH,
        })
    }

    /// Marks the ancestors of `run` that stopped because of it as resumed.
    async fn unblock_ancestors(
        self: &Arc<Self>,
        run: &RunId,
        because: RunStatus,
        reason: &str,
    ) -> Result<(), ExecError> {
        let (_, mut rec) = self.locate(run).await?;
        while let Some((parent, _)) = rec.parent.clone() {
            let (store, prec) = self.locate(&parent).await?;
            if prec.status == because {
                let state = refold(&load_episode(&*store, &parent).await?).map_err(|e| {
                    ExecError::Episode {
                        run: parent.to_string(),
                        detail: e.to_string(),
                    }
                })?;
                let seq = state.last_seq.map_or(0, |s| s + 1);
                let at = self.clock.now_ms();
                let ev = EpisodeEvent::RunResumed {
                    reason: reason.to_owned(),
                };
                store
                    .commit(store::Commit {
                        run: parent.clone(),
                        blobs: Vec::new(),
                        events: vec![store::NewEvent {
                            seq,
                            at,
                            kind: ev.kind().to_owned(),
                            body: serde_json::to_value(&ev).unwrap_or(Value::Null),
                        }],
                        intents: Vec::new(),
                        run_update: Some(store::RunUpdate {
                            status: RunStatus::Running,
                            reason: None,
                            output_hash: None,
                            updated_at: at,
                        }),
                        judgments: Vec::new(),
                        durability: Durability::Sync,
                    })
                    .await?;
            }
            rec = prec;
        }
        Ok(())
    }

    /// Creates a run and records its start.
    async fn create(
        self: &Arc<Self>,
        armed: Arc<Armed>,
        input: Value,
        parent: Option<ParentLink>,
        idempotency_key: Option<String>,
    ) -> Result<Started, ExecError> {
        let def = &armed.def;
        if let Some(schema) = &def.inputs {
            check_schema(schema, &input).map_err(|problems| ExecError::InvalidInput {
                workflow: def.id.to_string(),
                problems,
            })?;
        }
        let mut tools = BTreeMap::new();
        let mut verifiers = BTreeMap::new();
        for step in &def.steps {
            if let StepKind::Tool(t) = &step.kind {
                let (identity, effect) =
                    self.tools
                        .pin_tool(&t.tool)
                        .map_err(|cause| ExecError::Unavailable {
                            workflow: def.id.to_string(),
                            cause,
                        })?;
                tools.insert(t.tool.to_string(), PinnedTool { identity, effect });
            }
            for v in &step.verify {
                let identity = self.tools.pin_verifier(&v.verifier).map_err(|cause| {
                    ExecError::Unavailable {
                        workflow: def.id.to_string(),
                        cause,
                    }
                })?;
                verifiers.insert(v.verifier.to_string(), identity);
            }
        }
        // A child run lives with its parent; a top-level run where its
        // workflow's durability class says.
        let store = match &parent {
            Some(p) => {
                let parent_run = RunId::parse(&p.run).map_err(|e| ExecError::Episode {
                    run: p.run.clone(),
                    detail: e.to_string(),
                })?;
                self.locate(&parent_run).await?.0
            }
            None if def.durable => self.store.clone(),
            None => self.memory.clone(),
        };
        let now = self.clock.now_ms();
        // Runs refer to a stored version; publishing is idempotent.
        store
            .publish_version(store::NewVersion::of(
                def.id.clone(),
                workflow::canonical::canonical_bytes(def),
                None,
                now,
            ))
            .await?;
        let input_bytes = canonical_json(&input);
        let input_hash = store::BlobHash::of(&input_bytes);
        let id = RunId::generate(new_ulid(now));
        let parent_key = match &parent {
            Some(p) => Some((
                RunId::parse(&p.run).map_err(|e| ExecError::Episode {
                    run: p.run.clone(),
                    detail: e.to_string(),
                })?,
                p.step.clone(),
            )),
            None => None,
        };
        let created = store
            .create_run(NewRun {
                id: id.clone(),
                version: armed.version,
                input: input_bytes,
                idempotency_key,
                parent: parent_key,
                owner: Some(self.config.host_id.clone()),
                created_at: now,
            })
            .await?;
        let rec = match created {
            CreateRun::Existing(rec) => {
                return Ok(Started {
                    run: rec.id,
                    existing: true,
                });
            }
            CreateRun::Created(rec) => rec,
        };
        let ctx = RunCtx::new(
            self.clone(),
            store,
            rec.id.clone(),
            armed.clone(),
            RunScope::root(TenantId::default(), rec.id.to_string()),
            0,
            RunState::default(),
            &[],
        );
        ctx.record(
            vec![EpisodeEvent::RunStarted {
                workflow_id: def.id.clone(),
                version: armed.version,
                input,
                input_hash: input_hash.to_string(),
                parent,
                tools,
                verifiers,
            }],
            Vec::new(),
            Some((RunStatus::Running, None, None)),
            Durability::Sync,
        )
        .await
        .map_err(|h| halt_error(&rec.id, h))?;
        Ok(Started {
            run: rec.id,
            existing: false,
        })
    }

    /// Creates the child run of a sub-workflow step.
    pub(crate) async fn create_child(
        self: &Arc<Self>,
        parent: &RunCtx,
        version: WorkflowVersion,
        input: Value,
        link: ParentLink,
    ) -> Result<RunId, Failure> {
        if parent.depth + 1 > MAX_SUBWORKFLOW_DEPTH {
            return Err(Failure::new(
                FailureClass::InvalidInput,
                format!(
                    "sub-workflow nesting would exceed the kernel's bound of {MAX_SUBWORKFLOW_DEPTH}"
                ),
            ));
        }
        let armed = self.armory.arm(&version).await?;
        match self.create(armed, input, Some(link), None).await {
            Ok(s) => Ok(s.run),
            Err(ExecError::InvalidInput { workflow, problems }) => Err(Failure::new(
                FailureClass::InvalidInput,
                format!("the child workflow `{workflow}` refuses its input: {problems}"),
            )),
            Err(e) => Err(Failure::new(FailureClass::Unavailable, e.to_string())),
        }
    }

    /// Drives a child run inside its parent's scope.
    pub(crate) async fn drive_child(
        self: &Arc<Self>,
        parent: &RunCtx,
        child: &RunId,
        version: WorkflowVersion,
        scope: RunScope,
    ) -> Result<RunOutcome, Failure> {
        let unavailable = |e: ExecError| Failure::new(FailureClass::Unavailable, e.to_string());
        let armed = self.armory.arm(&version).await?;
        let ctx = self
            .load(child, armed, scope, parent.depth + 1)
            .await
            .map_err(unavailable)?;
        Ok(self.drive_ctx(ctx).await)
    }

    /// Loads a run's state and intents into a driving context.
    async fn load(
        self: &Arc<Self>,
        run: &RunId,
        armed: Arc<Armed>,
        scope: RunScope,
        depth: u32,
    ) -> Result<Arc<RunCtx>, ExecError> {
        let (store, _) = self.locate(run).await?;
        let episode = load_episode(&*store, run).await?;
        let state = refold(&episode).map_err(|e| ExecError::Episode {
            run: run.to_string(),
            detail: e.to_string(),
        })?;
        let intents = store.intents(run).await?;
        Ok(RunCtx::new(
            self.clone(),
            store,
            run.clone(),
            armed,
            scope,
            depth,
            state,
            &intents,
        ))
    }

    /// Drives a loaded run, registered as active while it is driven.
    async fn drive_ctx(self: &Arc<Self>, ctx: Arc<RunCtx>) -> RunOutcome {
        let key = ctx.run.to_string();
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), ctx.scope.clone());
        let snap = ctx.snapshot().await;
        if snap.status == Some(RunStatus::Running) {
            let resumed = snap.steps.values().any(|s| {
                matches!(
                    s.status,
                    crate::episode::StepStatus::Running | crate::episode::StepStatus::Waiting
                )
            });
            if resumed {
                // The run stopped mid-step with its host: say so in the episode.
                let _ = ctx
                    .record(
                        vec![EpisodeEvent::RunResumed {
                            reason: "recovered: the host stopped while the run was in flight"
                                .into(),
                        }],
                        Vec::new(),
                        None,
                        Durability::Buffered,
                    )
                    .await;
            }
        }
        let outcome = ctx.clone().drive().await;
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        outcome
    }

    /// Drives a top-level run.
    async fn drive_root(self: Arc<Self>, run: &RunId) -> Result<RunOutcome, ExecError> {
        let (_, rec) = self.locate(run).await?;
        if rec.status != RunStatus::Running {
            let state =
                refold(&load_episode(&*self.locate(run).await?.0, run).await?).map_err(|e| {
                    ExecError::Episode {
                        run: run.to_string(),
                        detail: e.to_string(),
                    }
                })?;
            return Ok(RunOutcome {
                run: run.clone(),
                status: rec.status,
                output: state.output.clone(),
                reason: rec.reason,
                state,
            });
        }
        let armed =
            self.armory
                .arm(&rec.version)
                .await
                .map_err(|cause| ExecError::Unavailable {
                    workflow: rec.workflow_id.to_string(),
                    cause,
                })?;
        let ctx = self
            .load(
                run,
                armed,
                RunScope::root(TenantId::default(), run.to_string()),
                0,
            )
            .await?;
        Ok(self.drive_ctx(ctx).await)
    }

    /// Cancels a run that no task of this host is driving.
    async fn cancel_stopped(self: &Arc<Self>, run: &RunId, reason: &str) -> Result<(), ExecError> {
        let (store, rec) = self.locate(run).await?;
        if rec.status.is_terminal() {
            return Err(ExecError::WrongStatus {
                run: run.to_string(),
                status: rec.status,
                what: "it already ended; nothing to cancel".into(),
            });
        }
        // Children first, so nothing below the run is left running.
        for child in store.children(run).await? {
            if !child.status.is_terminal() {
                Box::pin(self.cancel_stopped(&child.id, reason)).await?;
            }
        }
        let state = refold(&load_episode(&*store, run).await?).map_err(|e| ExecError::Episode {
            run: run.to_string(),
            detail: e.to_string(),
        })?;
        let intents = store.intents(run).await?;
        // Close every intent left dispatched.
        let mut last: BTreeMap<(StepId, u32, u32), &IntentRecord> = BTreeMap::new();
        for i in &intents {
            last.insert((i.step.clone(), i.iteration, i.attempt), i);
        }
        let now = self.clock.now_ms();
        let closing: Vec<IntentRecord> = last
            .values()
            .filter(|i| matches!(i.phase, IntentPhase::Pending | IntentPhase::Dispatched))
            .map(|i| IntentRecord {
                phase: IntentPhase::Failed,
                error: Some(format!("cancelled: {reason}")),
                output_hash: None,
                record: None,
                at: now,
                ..(*i).clone()
            })
            .collect();
        let seq = state.last_seq.map_or(0, |s| s + 1);
        let ev = EpisodeEvent::RunCancelled {
            reason: reason.to_owned(),
        };
        store
            .commit(store::Commit {
                run: run.clone(),
                blobs: Vec::new(),
                events: vec![store::NewEvent {
                    seq,
                    at: now,
                    kind: ev.kind().to_owned(),
                    body: serde_json::to_value(&ev).unwrap_or(Value::Null),
                }],
                intents: closing,
                run_update: Some(store::RunUpdate {
                    status: RunStatus::Cancelled,
                    reason: Some(reason.to_owned()),
                    output_hash: None,
                    updated_at: now,
                }),
                judgments: Vec::new(),
                durability: Durability::Sync,
            })
            .await?;
        Ok(())
    }
}
