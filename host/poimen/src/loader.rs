//! From stored versions to validated, runnable workflows.
//!
//! The validator is pure and synchronous; the store is async. This module
//! bridges them: it fetches every sub-workflow a definition can reach (by
//! selector, transitively) into an in-memory resolver first, then validates
//! against the sandbox's registries and that resolver. [`StoreLoader`] is the
//! executor's `WorkflowLoader`: a run's version is re-validated against the
//! registries of the host that runs it, so a tool that disappeared is an
//! error at load, not in the middle of a run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use poimen_executor::{Failure, FailureClass, Runnable, WorkflowLoader};
use poimen_store::{Store, StoreError};
use poimen_workflow::{
    MemoryWorkflows, Registries, StepKind, Validated, ValidationError, VersionSelector,
    WorkflowDef, WorkflowId, WorkflowVersion, from_canonical,
};

/// Most sub-workflow definitions fetched for one validation; the validator
/// bounds depth, this bounds breadth.
pub const MAX_FETCHED_SUBWORKFLOWS: usize = 10_000;

/// Why a definition could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored version {version} of `{workflow}` cannot be read back: {detail}")]
    Unreadable {
        workflow: String,
        version: WorkflowVersion,
        detail: String,
    },
    #[error("{} problem(s) found", .0.len())]
    Invalid(Vec<ValidationError>),
}

/// Fetches every sub-workflow `def` can reach, transitively.
pub async fn fetch_subworkflows(
    store: &dyn Store,
    def: &WorkflowDef,
) -> Result<MemoryWorkflows, CheckError> {
    let mut latest: BTreeMap<WorkflowId, (WorkflowVersion, WorkflowDef)> = BTreeMap::new();
    let mut pinned: BTreeMap<WorkflowVersion, WorkflowDef> = BTreeMap::new();
    let mut seen: BTreeSet<(WorkflowId, String)> = BTreeSet::new();
    let mut queue: Vec<WorkflowDef> = vec![def.clone()];
    while let Some(d) = queue.pop() {
        for step in &d.steps {
            let StepKind::SubWorkflow(s) = &step.kind else {
                continue;
            };
            let key = (s.id.clone(), format!("{:?}", s.version));
            if !seen.insert(key) || seen.len() > MAX_FETCHED_SUBWORKFLOWS {
                continue;
            }
            let record = match &s.version {
                VersionSelector::Latest => store.latest_version(&s.id).await?,
                VersionSelector::Pinned(v) => store.version(v).await?,
            };
            let Some(record) = record else { continue };
            let child = from_canonical(&record.canonical).map_err(|e| CheckError::Unreadable {
                workflow: record.workflow_id.to_string(),
                version: record.version,
                detail: e.to_string(),
            })?;
            match &s.version {
                VersionSelector::Latest => {
                    latest.insert(s.id.clone(), (record.version, child.clone()));
                }
                VersionSelector::Pinned(v) => {
                    pinned.insert(*v, child.clone());
                }
            }
            queue.push(child);
        }
    }
    // `MemoryWorkflows` resolves `latest` to the last inserted version of an
    // id: insert pinned versions first, the latest ones last.
    let mut mem = MemoryWorkflows::new();
    for (v, d) in pinned {
        mem.insert(v, d);
    }
    for (_, (v, d)) in latest {
        mem.insert(v, d);
    }
    Ok(mem)
}

/// Validates `def` against the sandbox's registries and the store's versions.
pub async fn check(
    store: &dyn Store,
    sandbox: &poimen_sandbox::PluginHost,
    def: &WorkflowDef,
) -> Result<Validated, CheckError> {
    let workflows = fetch_subworkflows(store, def).await?;
    let tools = sandbox.tools();
    let verifiers = sandbox.verifiers();
    let registries = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    poimen_workflow::validate(def, &registries).map_err(CheckError::Invalid)
}

/// The executor's `WorkflowLoader` over a store and a sandbox.
#[derive(Debug)]
pub struct StoreLoader {
    pub store: Arc<dyn Store>,
    pub sandbox: poimen_sandbox::PluginHost,
    cache: Mutex<HashMap<WorkflowVersion, Arc<Runnable>>>,
}

impl StoreLoader {
    pub fn new(store: Arc<dyn Store>, sandbox: poimen_sandbox::PluginHost) -> Self {
        StoreLoader {
            store,
            sandbox,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// An already validated definition, ready to run (and remembered).
    pub fn runnable(&self, validated: Validated) -> Arc<Runnable> {
        let runnable = Arc::new(Runnable::new(validated));
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(runnable.version, runnable.clone());
        runnable
    }
}

#[async_trait]
impl WorkflowLoader for StoreLoader {
    async fn load(&self, version: &WorkflowVersion) -> Result<Arc<Runnable>, Failure> {
        if let Some(a) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(version)
        {
            return Ok(a.clone());
        }
        let record = self
            .store
            .version(version)
            .await
            .map_err(|e| Failure::new(FailureClass::Unavailable, e.to_string()))?
            .ok_or_else(|| {
                Failure::new(
                    FailureClass::Unavailable,
                    format!(
                        "version {version} is not in the store; publish it with `poimen publish`"
                    ),
                )
            })?;
        let def = from_canonical(&record.canonical).map_err(|e| {
            Failure::new(
                FailureClass::Failed,
                format!("stored version {version} cannot be read back: {e}"),
            )
        })?;
        let validated = check(&*self.store, &self.sandbox, &def)
            .await
            .map_err(|e| match e {
                CheckError::Invalid(errors) => Failure::new(
                    FailureClass::Unavailable,
                    format!(
                        "version {version} of `{}` does not validate on this host: {}",
                        record.workflow_id,
                        errors
                            .iter()
                            .map(|e| e.to_string())
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ),
                other => Failure::new(FailureClass::Unavailable, other.to_string()),
            })?;
        Ok(self.runnable(validated))
    }
}
