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
    let components = sandbox.tools();
    let live_verifiers = sandbox.verifiers();
    // Workflows registered as tools, read only when a tool the definition
    // names is not a component.
    let needs_workflow_tools = tool_refs(def)
        .into_iter()
        .any(|r| components.resolve_tool(r).is_err());
    let workflow_tools = if needs_workflow_tools {
        workflow_tools(store, sandbox).await?.tools
    } else {
        BTreeMap::new()
    };
    let live_tools = WithWorkflowTools {
        components: &components,
        workflows: &workflow_tools,
    };
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

/// Every tool reference of a definition's own steps: tool steps' tools and
/// the tools model steps may call.
fn tool_refs(def: &WorkflowDef) -> Vec<&ToolRef> {
    let mut refs = Vec::new();
    for s in &def.steps {
        if let StepKind::Tool(t) = &s.kind {
            refs.push(&t.tool);
        }
        refs.extend(s.tools.0.iter());
    }
    refs
}

/// Workflows registered as tools, by tool name.
#[derive(Debug, Default)]
pub struct WorkflowTools {
    /// What a tool step resolves the name to.
    pub tools: BTreeMap<String, ToolInfo>,
    /// The workflow each name belongs to, and its definition.
    pub defs: BTreeMap<String, (WorkflowId, WorkflowDef)>,
    /// Names claimed by a component, or by an earlier workflow (by id), and
    /// so not registered: (tool name, the workflow that declared it, who
    /// holds the name).
    pub collisions: Vec<(String, WorkflowId, String)>,
}

/// The workflows that declare `tool:`, each at its armed version (at its
/// latest when it was never armed; a disarmed workflow is no tool), as
/// tools: a call runs that version as a child run. A name a component has
/// is the component's; of two workflows claiming one name, the first by id
/// keeps it.
pub async fn workflow_tools(
    store: &dyn Store,
    sandbox: &poimen_sandbox::PluginHost,
) -> Result<WorkflowTools, CheckError> {
    let components = sandbox.tools();
    let mut out = WorkflowTools::default();
    for w in store.workflows().await? {
        let version = match store.armed(&w.workflow_id).await? {
            Some(a) => match a.version {
                Some(v) => v,
                None => continue,
            },
            None => w.latest,
        };
        let Some(record) = store.version(&version).await? else {
            continue;
        };
        let def = from_canonical(&record.canonical).map_err(|e| CheckError::Unreadable {
            workflow: record.workflow_id.to_string(),
            version,
            detail: e.to_string(),
        })?;
        let Some(tool) = &def.tool else { continue };
        let name = tool.name.clone().unwrap_or_else(|| def.id.to_string());
        if let Ok(c) = components.resolve_tool(&ToolRef::any(name.clone())) {
            out.collisions.push((
                name,
                def.id.clone(),
                format!("the component `{}` {}", c.name, c.version),
            ));
            continue;
        }
        if let Some((holder, _)) = out.defs.get(&name) {
            out.collisions
                .push((name, def.id.clone(), format!("workflow `{holder}`")));
            continue;
        }
        let info = workflow_tool_info(&name, version, &def, &components);
        out.tools.insert(name.clone(), info);
        out.defs.insert(name, (def.id.clone(), def));
    }
    for (name, workflow, holder) in &out.collisions {
        tracing::warn!(%name, %workflow, %holder, "a workflow's tool name is taken; it is not registered as a tool");
    }
    Ok(out)
}

/// A workflow as a tool: its inputs and outputs are the contract, its
/// version the digest; it can do what the components it calls can
/// (capabilities, and the strongest effect class among them — anything it
/// reaches that is not a component counts as non-idempotent).
fn workflow_tool_info(
    name: &str,
    version: WorkflowVersion,
    def: &WorkflowDef,
    components: &impl ToolRegistry,
) -> ToolInfo {
    let mut effect = EffectClass::Pure;
    let mut capabilities = Vec::new();
    for r in tool_refs(def) {
        match components.resolve_tool(r) {
            Ok(info) => {
                effect = effect.max(info.effect);
                for c in info.capabilities {
                    if !capabilities.contains(&c) {
                        capabilities.push(c);
                    }
                }
            }
            Err(_) => effect = EffectClass::NonIdempotent,
        }
    }
    if def
        .steps
        .iter()
        .any(|s| matches!(s.kind, StepKind::SubWorkflow(_)))
    {
        effect = EffectClass::NonIdempotent;
    }
    ToolInfo {
        name: name.to_owned(),
        version: semver::Version::new(0, 0, 0),
        digest: version.to_string(),
        description: def
            .tool
            .as_ref()
            .and_then(|t| t.description.clone())
            .or_else(|| def.description.clone())
            .unwrap_or_default(),
        input_schema: def.inputs.clone().unwrap_or(Value::Bool(true)),
        output_schema: def.outputs.clone().unwrap_or(Value::Bool(true)),
        capabilities,
        effect,
        max_timeout_ms: None,
        workflow: Some(version),
    }
}

/// The components, then the workflows registered as tools.
struct WithWorkflowTools<'a, R> {
    components: &'a R,
    workflows: &'a BTreeMap<String, ToolInfo>,
}

impl<R: ToolRegistry> ToolRegistry for WithWorkflowTools<'_, R> {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.components
            .resolve_tool(tool)
            .or_else(|u| match self.workflows.get(&tool.name) {
                Some(info) if tool.version.matches(&info.version) => Ok(info.clone()),
                _ => Err(u),
            })
    }
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
            max_timeout_ms: None,
            workflow: None,
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

    /// Forgets every remembered version: the plugins changed, so a new run
    /// must be validated (and pin its components) against what is loaded
    /// now. Runs already started keep what they pinned.
    pub fn forget(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
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
