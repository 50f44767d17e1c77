//! From stored versions to validated, runnable workflows.
//!
//! The validator is pure and synchronous; the store is async. This module
//! bridges them: it fetches every sub-workflow a definition can reach (by
//! selector, transitively) into an in-memory resolver first, then validates
//! against the sandbox's registries and that resolver. [`StoreLoader`] is the
//! executor's `WorkflowLoader`: a version is re-validated against the
//! registries of the host that runs it, so a new run of a version whose tool
//! disappeared is refused before it starts. A run that already started
//! loads against what it pinned: a component it pinned that this host no
//! longer has fails only the step that reaches it, naming it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use poimen_executor::{Failure, FailureClass, Pins, Runnable, ToolIdentity, WorkflowLoader};
use poimen_store::{Store, StoreError};
use poimen_workflow::{
    EffectClass, MemoryWorkflows, Registries, StepKind, ToolInfo, ToolRef, ToolRegistry,
    Unresolved, Validated, ValidationError, VerifierRegistry, VersionSelector, WorkflowDef,
    WorkflowId, WorkflowVersion, from_canonical,
};
use serde_json::Value;

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
    check_with(store, sandbox, def, None).await
}

/// [`check`], with a run's pins standing in for components the sandbox no
/// longer has.
async fn check_with(
    store: &dyn Store,
    sandbox: &poimen_sandbox::PluginHost,
    def: &WorkflowDef,
    pins: Option<&Pins>,
) -> Result<Validated, CheckError> {
    let workflows = fetch_subworkflows(store, def).await?;
    let live_tools = sandbox.tools();
    let live_verifiers = sandbox.verifiers();
    let tools = PinnedFallback {
        live: &live_tools,
        pinned: pins.map(|p| {
            p.tools
                .iter()
                .map(|(r, t)| (r.clone(), (t.identity.clone(), t.effect)))
                .collect()
        }),
    };
    let verifiers = PinnedFallback {
        live: &live_verifiers,
        pinned: pins.map(|p| {
            p.verifiers
                .iter()
                .map(|(r, v)| (r.clone(), (v.clone(), EffectClass::Pure)))
                .collect()
        }),
    };
    let registries = Registries {
        tools: &tools,
        verifiers: &verifiers,
        workflows: &workflows,
    };
    poimen_workflow::validate(def, &registries).map_err(CheckError::Invalid)
}

/// A registry that resolves what it can, and a reference it cannot to the
/// component a run pinned for it: the run's version loads, and the step
/// that reaches the component fails when the sandbox cannot serve its
/// pinned digest, naming it.
struct PinnedFallback<'a, R> {
    live: &'a R,
    /// By the reference as written (`json@^0.1`).
    pinned: Option<BTreeMap<String, (ToolIdentity, EffectClass)>>,
}

impl<R> PinnedFallback<'_, R> {
    fn fallback(&self, r: &ToolRef, unresolved: Unresolved) -> Result<ToolInfo, Unresolved> {
        let Some((identity, effect)) = self.pinned.as_ref().and_then(|p| p.get(&r.to_string()))
        else {
            return Err(unresolved);
        };
        let Ok(version) = semver::Version::parse(&identity.version) else {
            return Err(unresolved);
        };
        Ok(ToolInfo {
            name: identity.name.clone(),
            version,
            digest: identity.digest.clone(),
            description: "pinned by the run; not loaded on this host".to_owned(),
            input_schema: Value::Bool(true),
            output_schema: Value::Bool(true),
            capabilities: Vec::new(),
            effect: *effect,
        })
    }
}

impl<R: ToolRegistry> ToolRegistry for PinnedFallback<'_, R> {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.live
            .resolve_tool(tool)
            .or_else(|u| self.fallback(tool, u))
    }
}

impl<R: VerifierRegistry> VerifierRegistry for PinnedFallback<'_, R> {
    fn resolve_verifier(&self, verifier: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.live
            .resolve_verifier(verifier)
            .or_else(|u| self.fallback(verifier, u))
    }
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
        let validated = self.validate(version, None).await?;
        Ok(self.runnable(validated))
    }

    async fn load_for_run(
        &self,
        version: &WorkflowVersion,
        pins: &Pins,
    ) -> Result<Arc<Runnable>, Failure> {
        // Not remembered: a new run of this version must still find every
        // component it names.
        let validated = self.validate(version, Some(pins)).await?;
        Ok(Arc::new(Runnable::new(validated)))
    }
}

impl StoreLoader {
    /// Reads a stored version back and validates it on this host (with a
    /// run's pins standing in for components it no longer has).
    async fn validate(
        &self,
        version: &WorkflowVersion,
        pins: Option<&Pins>,
    ) -> Result<Validated, Failure> {
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
        check_with(&*self.store, &self.sandbox, &def, pins)
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
            })
    }
}
