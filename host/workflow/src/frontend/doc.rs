//! The document shape shared by the YAML and JSON front ends.
//!
//! A workflow document is the IR written out, with two differences that
//! belong to the front end: a step names its kind by one key (`model:`,
//! `tool:`, `parallel:`, `conditional:`, `workflow:`, `judgment:`) instead of
//! an enum tag, and every optional field may be omitted. The step is read
//! into [`StepDoc`] — not into the IR with `#[serde(flatten)]`, because
//! flatten silently disables `deny_unknown_fields` — and the exactly-one-kind
//! rule is checked when converting. These types also generate the format's
//! JSON Schema.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{ParseErrorKind, PathSeg};
use crate::ir::*;

/// A poimen workflow document (format version 1).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "poimen workflow")]
pub struct WorkflowDoc {
    /// Stable name of the workflow (`billing.refund`).
    pub id: WorkflowId,
    /// Format version of the document: 1.
    #[serde(default)]
    pub schema: SchemaVersion,
    /// What the workflow is for (agents read it; part of the version).
    #[serde(default)]
    pub description: Option<String>,
    /// JSON Schema the run input must satisfy.
    #[serde(default)]
    pub inputs: Option<Value>,
    /// JSON Schema the run output must satisfy.
    #[serde(default)]
    pub outputs: Option<Value>,
    /// How the run output is built: JSON whose strings are templates.
    #[serde(default)]
    pub output: Option<ArgTemplate>,
    /// Scheduling weight under contention: `low`, `normal` (default) or `high`.
    #[serde(default)]
    pub priority: Priority,
    /// How many runs may be active at once, and what happens past that.
    #[serde(default)]
    pub concurrency: Concurrency,
    /// Template of the logical thing a run is about; reads `inputs` only.
    #[serde(default)]
    pub key: Option<Template>,
    /// `false` keeps runs in memory only (no checkpoints, gone after a
    /// restart); `true` makes them durable whatever the host's default;
    /// absent, the host's default (`durability.work` in its policy) holds.
    #[serde(default)]
    pub durable: Option<bool>,
    /// What happens to live runs of this version when another version is
    /// armed or the workflow is disarmed: `{policy: drain|cancel|detach,
    /// timeout}`.
    #[serde(default)]
    pub unload: Unload,
    /// Declared run variables: `{key: {schema, reducer}}`.
    #[serde(default)]
    pub state: BTreeMap<StateKey, StateDecl>,
    /// Structural limits of one run.
    #[serde(default)]
    pub limits: Limits,
    /// Expose this workflow as a tool.
    #[serde(default)]
    pub tool: Option<WorkflowTool>,
    /// Reject the workflow at load unless every step can run in shadow evaluation.
    #[serde(default)]
    pub shadow_evaluable: bool,
    /// The steps (a set keyed by id).
    pub steps: Vec<StepDoc>,
    /// Dependency edges, and bounded back-edges (with `max_iterations`).
    #[serde(default)]
    pub transitions: Vec<Transition>,
    /// How a run's result is judged.
    #[serde(default)]
    pub rubric: RubricDef,
    /// Cost budget of one run.
    #[serde(default)]
    pub budget: BudgetDef,
}

/// One step: an id, exactly one kind key, and the common fields.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = exactly_one_kind)]
pub struct StepDoc {
    /// Step id, stable across versions.
    pub id: StepId,
    /// Ask a model.
    #[serde(default)]
    pub model: Option<ModelStep>,
    /// Call a tool.
    #[serde(default)]
    pub tool: Option<ToolStep>,
    /// Run owned branch steps concurrently and join them.
    #[serde(default)]
    pub parallel: Option<ParallelStep>,
    /// Run one of two owned steps, chosen by a CEL predicate.
    #[serde(default)]
    pub conditional: Option<ConditionalStep>,
    /// Run another workflow as a child run.
    #[serde(default)]
    pub workflow: Option<SubWorkflowStep>,
    /// Pause until an external judge answers.
    #[serde(default)]
    pub judgment: Option<JudgmentStep>,
    /// Tools offered to the step beyond its kind (a set).
    #[serde(default)]
    pub tools: ToolSelector,
    /// Verifiers run after every attempt (a set).
    #[serde(default)]
    pub verify: Vec<VerifierRef>,
    /// Weighted criteria every attempt's output must meet (after `verify`);
    /// failing it is a verifier rejection.
    #[serde(default)]
    pub rubric: RubricDef,
    /// Serial retry of failed attempts.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Timeout of one attempt (default 60s).
    #[serde(default)]
    pub timeout: Option<Millis>,
    /// State key the step's output is written to.
    #[serde(default)]
    pub writes: Option<StateKey>,
}

fn exactly_one_kind(schema: &mut schemars::Schema) {
    let one_of: Vec<Value> = StepKind::NAMES
        .iter()
        .map(|k| serde_json::json!({ "required": [k] }))
        .collect();
    schema.insert("oneOf".into(), Value::Array(one_of));
}

/// Why a document does not make a step: not exactly one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindError {
    pub kind: ParseErrorKind,
}

impl std::fmt::Display for KindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind.fmt(f)
    }
}

impl StepDoc {
    fn into_step(self) -> Result<StepDef, KindError> {
        let StepDoc {
            id,
            model,
            tool,
            parallel,
            conditional,
            workflow,
            judgment,
            tools,
            verify,
            rubric,
            retry,
            timeout,
            writes,
        } = self;
        let (model_given, tool_given, parallel_given) =
            (model.is_some(), tool.is_some(), parallel.is_some());
        let (conditional_given, workflow_given, judgment_given) = (
            conditional.is_some(),
            workflow.is_some(),
            judgment.is_some(),
        );
        let kinds = [
            model.map(StepKind::Model),
            tool.map(StepKind::Tool),
            parallel.map(StepKind::Parallel),
            conditional.map(StepKind::Conditional),
            workflow.map(StepKind::SubWorkflow),
            judgment.map(StepKind::Judgment),
        ];
        let count = kinds.iter().filter(|k| k.is_some()).count();
        let Some(kind) = kinds.into_iter().flatten().next().filter(|_| count == 1) else {
            let found = [
                ("model", model_given),
                ("tool", tool_given),
                ("parallel", parallel_given),
                ("conditional", conditional_given),
                ("workflow", workflow_given),
                ("judgment", judgment_given),
            ]
            .iter()
            .filter(|(_, given)| *given)
            .map(|(k, _)| (*k).to_owned())
            .collect();
            return Err(KindError {
                kind: ParseErrorKind::StepKind { step: id.0, found },
            });
        };
        Ok(StepDef {
            id,
            kind,
            tools,
            verify,
            rubric,
            retry,
            timeout,
            writes,
        })
    }
}

impl WorkflowDoc {
    /// The IR, or the first step that does not have exactly one kind (with
    /// its path in the document).
    pub(crate) fn into_def(self) -> Result<WorkflowDef, (Vec<PathSeg>, KindError)> {
        let WorkflowDoc {
            id,
            schema,
            description,
            inputs,
            outputs,
            output,
            priority,
            concurrency,
            key,
            durable,
            unload,
            state,
            limits,
            tool,
            shadow_evaluable,
            steps,
            transitions,
            rubric,
            budget,
        } = self;
        let mut out = Vec::with_capacity(steps.len());
        for (i, s) in steps.into_iter().enumerate() {
            match s.into_step() {
                Ok(s) => out.push(s),
                Err(e) => return Err((vec![PathSeg::Key("steps".into()), PathSeg::Index(i)], e)),
            }
        }
        Ok(WorkflowDef {
            id,
            schema,
            description,
            inputs,
            outputs,
            output,
            priority,
            concurrency,
            key,
            durable,
            unload,
            state,
            limits,
            tool,
            shadow_evaluable,
            steps: out,
            transitions,
            rubric,
            budget,
        })
    }
}

impl TryFrom<StepDoc> for StepDef {
    type Error = KindError;
    fn try_from(doc: StepDoc) -> Result<StepDef, KindError> {
        doc.into_step()
    }
}

// The IR's `Deserialize` goes through the strict document shape; it is
// written here, not derived on the IR, so the IR does not depend on its
// front end.
impl<'de> Deserialize<'de> for StepDef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StepDef, D::Error> {
        StepDoc::deserialize(d)?
            .into_step()
            .map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for WorkflowDef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<WorkflowDef, D::Error> {
        WorkflowDoc::deserialize(d)?
            .into_def()
            .map_err(|(_, e)| serde::de::Error::custom(e))
    }
}

impl TryFrom<WorkflowDoc> for WorkflowDef {
    type Error = KindError;
    fn try_from(doc: WorkflowDoc) -> Result<WorkflowDef, KindError> {
        doc.into_def().map_err(|(_, e)| e)
    }
}
