//! A workflow version ready to run, and the trait that produces one.
//!
//! A [`Runnable`] is a validated version (only the validator makes a
//! `Validated`, so only a valid workflow runs) with the shape the validator
//! computed and the exact versions of its sub-workflows. The executor walks
//! that shape; it never computes a second one.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use poimen_workflow::{Shape, StepDef, StepId, Validated, WorkflowDef, WorkflowVersion};

use crate::effects::Failure;

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
}

impl Runnable {
    /// A workflow that passed validation, ready to run.
    pub fn new(validated: Validated) -> Runnable {
        Runnable {
            subworkflows: validated.sub_workflow_versions(),
            version: validated.version(),
            shape: Arc::clone(validated.shape()),
            def: validated.def_arc(),
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
/// against the registries of the host that runs it, so a tool that
/// disappeared is an error at load, not in the middle of a run.
#[async_trait]
pub trait WorkflowLoader: Send + Sync {
    async fn load(&self, version: &WorkflowVersion) -> Result<Arc<Runnable>, Failure>;
}
