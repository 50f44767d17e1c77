//! A workflow version ready to run, and the trait that produces one.
//!
//! A [`Runnable`] is a validated version (only the validator makes a
//! `Validated`, so only a valid workflow runs) with the shape the validator
//! computed, the exact versions of its sub-workflows, what a run of it pins
//! when it starts, and its schemas compiled once. The executor walks that
//! shape; it never computes a second one.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use poimen_workflow::{Shape, StepDef, StepId, ToolInfo, Validated, WorkflowDef, WorkflowVersion};

use crate::effects::{Failure, ToolIdentity};
use crate::episode::{PinnedChild, PinnedTool, Pins};
use crate::schema::Schema;

/// A validated workflow version, ready to run.
#[derive(Debug, Clone)]
pub struct Runnable {
    pub def: Arc<WorkflowDef>,
    pub version: WorkflowVersion,
    /// Exact versions of the sub-workflows, by the step that runs them (as
    /// the validator resolved them).
    pub subworkflows: BTreeMap<StepId, WorkflowVersion>,
    /// The workflow's shape, as the validator computed it.
    pub shape: Arc<Shape>,
    /// What a run of this version pins when it starts: every tool and
    /// verifier it can reach with its digest, and each sub-workflow's
    /// version with the child's own pins.
    pub pins: Pins,
    pub(crate) schemas: Schemas,
}

/// The workflow's schemas, compiled once.
#[derive(Debug, Clone, Default)]
pub(crate) struct Schemas {
    pub inputs: Option<Schema>,
    pub outputs: Option<Schema>,
    /// By declared state key.
    pub state: BTreeMap<String, Schema>,
    /// Model steps' answer schemas, by step.
    pub model: BTreeMap<StepId, Schema>,
}

fn identity(info: &ToolInfo) -> ToolIdentity {
    ToolIdentity {
        name: info.name.clone(),
        version: info.version.to_string(),
        digest: info.digest.clone(),
    }
}

/// The pins of a validated workflow, from what the validator resolved.
fn pins_of(v: &Validated) -> Pins {
    Pins {
        tools: v
            .tools()
            .iter()
            .map(|(r, info)| {
                (
                    r.to_string(),
                    PinnedTool {
                        identity: identity(info),
                        effect: info.effect,
                        workflow: info.workflow,
                    },
                )
            })
            .collect(),
        verifiers: v
            .verifiers()
            .iter()
            .map(|(r, info)| (r.to_string(), identity(info)))
            .collect(),
        subworkflows: v
            .sub_workflows()
            .iter()
            .map(|(step, child)| {
                (
                    step.clone(),
                    PinnedChild {
                        version: child.version(),
                        pins: pins_of(child),
                    },
                )
            })
            .collect(),
    }
}

impl Runnable {
    /// A workflow that passed validation, ready to run.
    pub fn new(validated: Validated) -> Runnable {
        let def = validated.def_arc();
        let schemas = Schemas {
            inputs: def.inputs.as_ref().map(Schema::new),
            outputs: def.outputs.as_ref().map(Schema::new),
            state: def
                .state
                .iter()
                .filter_map(|(k, d)| d.schema.as_ref().map(|s| (k.0.clone(), Schema::new(s))))
                .collect(),
            model: def
                .steps
                .iter()
                .filter_map(|s| match &s.kind {
                    poimen_workflow::StepKind::Model(m) => {
                        m.schema.as_ref().map(|x| (s.id.clone(), Schema::new(x)))
                    }
                    _ => None,
                })
                .collect(),
        };
        Runnable {
            subworkflows: validated.sub_workflow_versions(),
            version: validated.version(),
            shape: Arc::clone(validated.shape()),
            pins: pins_of(&validated),
            schemas,
            def,
        }
    }

    /// The step with this id.
    pub fn step(&self, id: &StepId) -> Option<&StepDef> {
        self.shape.lookup(id.as_str()).map(|i| &self.def.steps[i])
    }

    /// The step at index `i` of the definition.
    pub fn step_at(&self, i: usize) -> &StepDef {
        &self.def.steps[i]
    }
}

/// Turns a stored version into a [`Runnable`]: loads it and validates it
/// against the registries of the host that runs it, so a new run of a
/// version whose tool disappeared is refused before it starts.
#[async_trait]
pub trait WorkflowLoader: Send + Sync {
    async fn load(&self, version: &WorkflowVersion) -> Result<Arc<Runnable>, Failure>;

    /// Loads the version a run already started on, when [`load`](Self::load)
    /// refused it. `pins` are what the run pinned at its start: a component
    /// it pinned that this host no longer has must not keep the whole run
    /// from loading — the run fails at the step that reaches it, naming it,
    /// and a run that never reaches it finishes. The default refuses, as
    /// `load` did.
    async fn load_for_run(
        &self,
        version: &WorkflowVersion,
        pins: &Pins,
    ) -> Result<Arc<Runnable>, Failure> {
        let _ = pins;
        self.load(version).await
    }
}
