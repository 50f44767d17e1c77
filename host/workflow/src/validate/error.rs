//! `ValidationError`: one variant per check, each carrying the offending
//! ids, an actionable `Display` (what is wrong, where, what to do) and a
//! JSON rendering (`{"code": "duplicate_step_id", "step": "fetch"}`) for
//! tools (`poimen validate --json`).
//!
//! Every variant has a stable `code` (its snake_case name). The list of
//! codes ([`ValidationCode`]) is derived from the enum, so the validation
//! table test can require one fixture per code.

use std::fmt;

use serde::Serialize;

use crate::capability::Ineligibility;
use crate::ir::{StateKey, StepId, WorkflowId};
use crate::version::WorkflowVersion;

/// Where in a workflow a template, predicate or schema sits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "in", rename_all = "snake_case")]
pub enum Site {
    /// A field of a step (`model.prompt`, `tool.args.text`, `judgment.sources[0]`).
    Step { step: StepId, field: String },
    /// The `when` predicate of the back-edge `from -> to`.
    Transition { from: StepId, to: StepId },
    /// A workflow-level field (`key`, `output`, `inputs`, `state.notes.schema`, `rubric`).
    Workflow { field: String },
}

impl Site {
    pub(crate) fn step(step: &StepId, field: impl Into<String>) -> Site {
        Site::Step {
            step: step.clone(),
            field: field.into(),
        }
    }

    pub(crate) fn workflow(field: impl Into<String>) -> Site {
        Site::Workflow {
            field: field.into(),
        }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Step { step, field } => write!(f, "step `{step}`, field `{field}`"),
            Site::Transition { from, to } => write!(f, "the `when` of transition `{from} -> {to}`"),
            Site::Workflow { field } => write!(f, "workflow field `{field}`"),
        }
    }
}

/// One way a static value breaks a JSON Schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SchemaViolation {
    /// JSON Pointer into the value (`/text`), empty for the value itself.
    pub at: String,
    /// The schema keyword the value breaks (`type`, `required`, `maximum`, …).
    pub rule: String,
    pub message: String,
}

/// A use of a tool or verifier that may not run in shadow evaluation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct IneligibleStep {
    /// Sub-workflow steps leading to the workflow that holds the use,
    /// outermost first; empty for a use in the workflow itself.
    pub via: Vec<StepId>,
    /// The workflow holding the step.
    pub workflow: WorkflowId,
    /// The step using the tool (`None` for a criterion of the workflow's
    /// rubric).
    pub step: Option<StepId>,
    /// The rubric criterion using the verifier, if that is the use: of the
    /// step's rubric when `step` is set, else of the workflow's.
    pub criterion: Option<String>,
    /// The tool or verifier as referenced (`http-get@^0.1`).
    pub tool: String,
    /// Each capability or effect class that disqualifies it.
    pub reasons: Vec<Ineligibility>,
}

impl fmt::Display for IneligibleStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.via {
            write!(f, "{s} → ")?;
        }
        match (&self.step, &self.criterion) {
            (Some(s), Some(c)) => write!(f, "rubric criterion `{c}` of step `{s}`")?,
            (Some(s), None) => write!(f, "step `{s}`")?,
            (None, Some(c)) => write!(f, "rubric criterion `{c}`")?,
            (None, None) => f.write_str("workflow")?,
        }
        write!(f, " of `{}` uses `{}`: ", self.workflow, self.tool)?;
        let reasons: Vec<String> = self.reasons.iter().map(ToString::to_string).collect();
        f.write_str(&reasons.join("; "))
    }
}

pub(crate) fn arrow<T: fmt::Display>(path: &[T]) -> String {
    path.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" -> ")
}

fn ids<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn nearest_hint(nearest: &[String]) -> String {
    if nearest.is_empty() {
        String::new()
    } else {
        format!(" Nearest names: {}.", ids(nearest))
    }
}

fn versions_hint(versions: &[String]) -> String {
    if versions.is_empty() {
        String::new()
    } else {
        format!(" Registered versions of that name: {}.", ids(versions))
    }
}

fn fmt_violations(v: &[SchemaViolation]) -> String {
    v.iter()
        .map(|x| {
            if x.at.is_empty() {
                x.message.clone()
            } else {
                format!("at `{}`: {}", x.at, x.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whose rubric, in words: " of step `s`" for a step's, nothing for the
/// workflow's.
fn of_step(step: &Option<StepId>) -> String {
    match step {
        Some(s) => format!(" of step `{s}`"),
        None => String::new(),
    }
}

fn via_hint(via: &[WorkflowId]) -> String {
    if via.is_empty() {
        String::new()
    } else {
        format!(" (called through {})", arrow(via))
    }
}

fn depth_of<T>(path: &[T]) -> usize {
    path.len().saturating_sub(1)
}

fn nested(errors: &[ValidationError]) -> String {
    errors.iter().map(|e| format!("\n    - {e}")).collect()
}

fn ineligible(steps: &[IneligibleStep]) -> String {
    steps.iter().map(|s| format!("\n    - {s}")).collect()
}

/// Everything the validator can find wrong with a workflow, one variant per
/// check. Matching on the variant (never on the message) is the contract.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(ValidationCode))]
#[strum_discriminants(derive(
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    strum::EnumIter,
    strum::IntoStaticStr
))]
#[strum_discriminants(serde(rename_all = "snake_case"))]
#[strum_discriminants(strum(serialize_all = "snake_case"))]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ValidationError {
    // ── shape and names ──────────────────────────────────────────────────
    #[error("the workflow has no steps: add at least one step")]
    NoSteps,
    #[error(
        "document format `schema: {found}` is not supported: this poimen reads `schema: {supported}`"
    )]
    UnsupportedSchema { found: u32, supported: u32 },
    #[error(
        "workflow id `{workflow}` is not valid: use dot-separated segments of lower-case letters, digits, `_` and `-`, each starting with a letter (e.g. `billing.refund`), at most 128 characters"
    )]
    InvalidWorkflowId { workflow: WorkflowId },
    #[error(
        "tool name `{name}` (under `tool:`) is not valid: use the workflow-id pattern (lower-case, dot-separated, e.g. `billing.refund`)"
    )]
    InvalidToolName { name: String },
    #[error(
        "step id `{step}` is not valid: use a lower-case letter then up to 63 lower-case letters, digits or `_` (ids are template attributes: `steps.{step}.output`)"
    )]
    InvalidStepId { step: StepId },
    #[error("step id `{step}` is used by more than one step: rename one of them")]
    DuplicateStepId { step: StepId },
    #[error(
        "state key `{key}` is not valid: use a lower-case letter then up to 63 lower-case letters, digits or `_` (keys are read as `state.<key>`)"
    )]
    InvalidStateKey { key: StateKey },

    // ── transitions ──────────────────────────────────────────────────────
    #[error(
        "transition `{from} -> {to}` names step `{missing}`, which does not exist: fix the name or add the step"
    )]
    UnknownTransitionStep {
        from: StepId,
        to: StepId,
        missing: StepId,
    },
    #[error("transition `{from} -> {to}` is declared more than once: keep one")]
    DuplicateTransition { from: StepId, to: StepId },
    #[error(
        "unbounded loop {}: forward transitions must not form a cycle; make the edge that closes it a back-edge with `max_iterations`",
        arrow(.path)
    )]
    ForwardCycle { path: Vec<StepId> },
    #[error(
        "back-edge `{from} -> {to}` does not point backwards: `{to}` must be `{from}` itself or run before it (a forward ancestor); a loop re-runs the steps from `{to}` through `{from}`"
    )]
    BackEdgeNotBackward { from: StepId, to: StepId },
    #[error(
        "back-edge `{from} -> {to}` allows {max_iterations} iterations, over the limit of {limit}: lower `max_iterations`"
    )]
    LoopBoundTooLarge {
        from: StepId,
        to: StepId,
        max_iterations: u32,
        limit: u32,
    },
    #[error("step `{from}` has several back-edges ({}): give each step at most one; nest loops instead", ids(.to))]
    MultipleBackEdges { from: StepId, to: Vec<StepId> },
    #[error(
        "forward transition `{from} -> {to}` has a `when` predicate: only back-edges (with `max_iterations`) take one; branch with a `conditional` step instead"
    )]
    PredicateOnForwardEdge { from: StepId, to: StepId },

    // ── ownership (parallel branches, conditional targets) ───────────────
    #[error(
        "step `{owner}` owns step `{step}`, which does not exist: fix the name or add the step"
    )]
    UnknownOwnedStep { owner: StepId, step: StepId },
    #[error("step `{owner}` lists step `{step}` more than once: a branch or target appears once")]
    DuplicateOwnedStep { owner: StepId, step: StepId },
    #[error("step `{step}` is owned by several steps ({}): a branch or conditional target has exactly one owner", ids(.owners))]
    MultipleOwners { step: StepId, owners: Vec<StepId> },
    #[error(
        "step `{step}` is owned by `{owner}` but appears in transition `{from} -> {to}`: owned steps are run by their owner and take part in no transition; connect `{owner}` instead"
    )]
    OwnedStepInTransition {
        step: StepId,
        owner: StepId,
        from: StepId,
        to: StepId,
    },
    #[error("ownership cycle {}: a step cannot (indirectly) own itself", arrow(.path))]
    OwnershipCycle { path: Vec<StepId> },
    #[error(
        "step `{step}` can never run: it is not reachable from a start step (it depends on a cycle, or its owner never runs)"
    )]
    Unreachable { step: StepId },

    // ── parallel ─────────────────────────────────────────────────────────
    #[error("parallel step `{step}` has no branches: list at least one")]
    EmptyParallel { step: StepId },
    #[error(
        "parallel step `{step}` has {width} branches, over the limit of {limit}: split the fan-out"
    )]
    ParallelTooWide {
        step: StepId,
        width: usize,
        limit: usize,
    },
    #[error(
        "parallel step `{step}` has quorum {quorum} with {branches} branches: the quorum must be between 1 and the branch count"
    )]
    InvalidQuorum {
        step: StepId,
        quorum: u32,
        branches: usize,
    },
    #[error(
        "branches {} of parallel step `{step}` all write state key `{key}`, which declares no reducer: declare `state.{key}.reducer` (overwrite, append, merge or union)",
        ids(.branches)
    )]
    ParallelWritesNeedReducer {
        step: StepId,
        key: StateKey,
        branches: Vec<StepId>,
    },

    // ── state ────────────────────────────────────────────────────────────
    #[error("step `{step}` writes state key `{key}`, which is not declared: add it under `state:`")]
    UndeclaredStateWrite { step: StepId, key: StateKey },

    // ── templates and predicates ─────────────────────────────────────────
    #[error("template in {site} does not parse: {message}")]
    TemplateSyntax { site: Site, message: String },
    #[error(
        "template in {site} is {bytes} bytes, over the limit of {limit}: shorten it or pass the text as input"
    )]
    TemplateTooLarge {
        site: Site,
        bytes: usize,
        limit: usize,
    },
    #[error("predicate in {site} does not compile as CEL: {message}")]
    PredicateSyntax { site: Site, message: String },
    #[error("predicate in {site} is {bytes} bytes, over the limit of {limit}")]
    PredicateTooLarge {
        site: Site,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "predicate in {site} nests {depth} levels deep, over the limit of {limit}: split it, or test membership with `in` or a macro such as `exists`"
    )]
    PredicateTooDeep {
        site: Site,
        depth: usize,
        limit: usize,
    },
    #[error(
        "predicate in {site} nests {nesting} macros (`all`, `exists`, `map`, …) in one another, over the limit of {limit}: each runs its body once per element, so nested ones multiply"
    )]
    PredicateLoopsTooDeep {
        site: Site,
        nesting: usize,
        limit: usize,
    },
    #[error(
        "predicate in {site} calls `{function}`, which is not available: predicates read only recorded state (`inputs`, `state`, `steps`) through CEL's standard functions — no clock, environment or randomness"
    )]
    PredicateNotPure { site: Site, function: String },
    #[error(
        "{site} reads `{variable}`, which does not exist: templates and predicates may read `inputs`, `state.<declared key>` and `steps.<id>.output` (or `.status`)"
    )]
    UnknownVariable { site: Site, variable: String },
    #[error(
        "{site} reads `steps` without a literal step id: write `steps.<id>.output` so the reference can be checked"
    )]
    DynamicStepReference { site: Site },
    #[error("{site} reads step `{step}`, which does not exist: fix the id")]
    UnknownStepReference { site: Site, step: StepId },
    #[error(
        "{site} reads the output of step `{step}`, which does not run before it on every path: add a transition so `{step}` comes first (owned steps are read through their owner)"
    )]
    StepNotBefore { site: Site, step: StepId },
    #[error("{site} reads `state.{key}`, which is not declared: add it under `state:`")]
    UndeclaredStateRead { site: Site, key: String },
    #[error(
        "the workflow `key` reads `{variable}`: the key is rendered when a run is admitted, before any step runs, so it may read `inputs` only"
    )]
    KeyNotFromInputs { variable: String },

    // ── concurrency ──────────────────────────────────────────────────────
    #[error(
        "`concurrency.scope: key` needs a `key` template saying what a run is about: add `key:` (e.g. `\"{{{{ inputs.account }}}}\"`)"
    )]
    KeyScopeWithoutKey,
    #[error(
        "`concurrency.max_runs: 0` admits no run at all: give at least 1, or leave it out for no limit"
    )]
    ZeroMaxRuns,

    // ── kernel limits ────────────────────────────────────────────────────
    #[error(
        "the workflow has {count} steps, over the limit of {limit}: split it into sub-workflows"
    )]
    TooManySteps { count: usize, limit: usize },
    #[error("step `{step}` allows {attempts} attempts: give between 1 and {limit}")]
    RetryAttemptsOutOfRange {
        step: StepId,
        attempts: u32,
        limit: u32,
    },
    #[error("step `{step}` has a timeout of {timeout_ms} ms: give between 1 ms and {limit_ms} ms")]
    TimeoutOutOfRange {
        step: StepId,
        timeout_ms: u64,
        limit_ms: u64,
    },
    #[error(
        "step `{step}` has a timeout of {timeout_ms} ms, but the sandbox policy lets `{tool}` run at most {max_ms} ms a call: lower the step's timeout to {max_ms} ms or less, or raise `timeout-ms` for this component in the policy file"
    )]
    TimeoutAbovePolicy {
        step: StepId,
        tool: String,
        timeout_ms: u64,
        max_ms: u64,
    },
    #[error(
        "`{field}` is {value}, beyond 2^53 − 1, which the canonical form cannot represent exactly: lower it"
    )]
    IntegerTooLarge { field: String, value: u64 },
    #[error(
        "`unload.timeout` is given with `unload.policy: {policy}`: a timeout bounds how long runs drain; use `policy: drain`, or drop the timeout"
    )]
    UnloadTimeoutWithoutDrain { policy: String },
    #[error(
        "`unload.timeout` is 0 ms: give how long live runs may drain (at least 1 ms), or `policy: cancel` to cancel them at once"
    )]
    ZeroUnloadTimeout,

    // ── schemas ──────────────────────────────────────────────────────────
    #[error("the JSON Schema in {site} is not a valid schema: {message}")]
    InvalidSchema { site: Site, message: String },
    #[error(
        "model step `{step}` gives its answer a `schema` but `format: text`: a schema checks a JSON answer, so add `format: json` (or drop the schema)"
    )]
    SchemaNeedsJsonFormat { step: StepId },

    // ── registries ───────────────────────────────────────────────────────
    #[error(
        "step `{step}` uses tool `{tool}`, which registry `{registry}` does not have (asked for `{name}` {requested}).{}{} Register the tool or fix the reference.",
        versions_hint(.available_versions), nearest_hint(.nearest)
    )]
    UnresolvedTool {
        step: StepId,
        /// The reference as written.
        tool: String,
        /// The name looked up.
        name: String,
        /// The semver range looked up.
        requested: String,
        /// The registry searched.
        registry: String,
        nearest: Vec<String>,
        available_versions: Vec<String>,
    },
    #[error("step `{step}` uses tool `{tool}`, which is installed but withheld: {reason}")]
    WithheldTool {
        step: StepId,
        /// The reference as written.
        tool: String,
        /// Why it is withheld and how to grant it (names the capability and
        /// the policy consulted).
        reason: String,
    },
    #[error(
        "{site} uses verifier `{verifier}`, which registry `{registry}` does not have (asked for `{name}` {requested}).{}{} Register the verifier or fix the reference.",
        versions_hint(.available_versions), nearest_hint(.nearest)
    )]
    UnresolvedVerifier {
        site: Site,
        verifier: String,
        name: String,
        requested: String,
        registry: String,
        nearest: Vec<String>,
        available_versions: Vec<String>,
    },
    #[error("static arguments of step `{step}` do not match the input schema of `{tool}`: {}", fmt_violations(.violations))]
    ArgsViolateSchema {
        step: StepId,
        tool: String,
        violations: Vec<SchemaViolation>,
    },
    #[error("the `on_timeout` answer of judgment step `{step}` does not match its `result_schema`: {}; a fallback answer is taken as if a judge gave it, so it must be one", fmt_violations(.violations))]
    FallbackAnswerViolatesSchema {
        step: StepId,
        violations: Vec<SchemaViolation>,
    },
    #[error("configuration in {site} does not match the configuration schema of verifier `{verifier}`: {}", fmt_violations(.violations))]
    ConfigViolatesSchema {
        site: Site,
        verifier: String,
        violations: Vec<SchemaViolation>,
    },
    #[error(
        "the input schema registered for `{tool}` is not a valid JSON Schema ({message}): fix the tool's descriptor"
    )]
    ToolSchemaInvalid { tool: String, message: String },

    // ── rubric (the workflow's, or a step's when `step` is set) ───────────
    #[error(
        "rubric criterion `{name}`{} is declared more than once: criterion names are unique",
        of_step(.step)
    )]
    DuplicateCriterion {
        /// The step whose rubric it is; `None` for the workflow's rubric.
        #[serde(skip_serializing_if = "Option::is_none")]
        step: Option<StepId>,
        name: String,
    },
    #[error(
        "rubric criterion `{criterion}`{} has weight {weight}: weights must be finite and greater than 0",
        of_step(.step)
    )]
    InvalidWeight {
        /// The step whose rubric it is; `None` for the workflow's rubric.
        #[serde(skip_serializing_if = "Option::is_none")]
        step: Option<StepId>,
        criterion: String,
        weight: f64,
    },
    #[error(
        "rubric threshold {threshold}{} is not a score: give a number between 0 and 1",
        of_step(.step)
    )]
    InvalidThreshold {
        /// The step whose rubric it is; `None` for the workflow's rubric.
        #[serde(skip_serializing_if = "Option::is_none")]
        step: Option<StepId>,
        threshold: f64,
    },

    // ── sub-workflows ────────────────────────────────────────────────────
    #[error(
        "step `{step}` runs workflow `{workflow}` ({selector}), which was not found in {searched}{}: publish it or fix the reference",
        via_hint(.via)
    )]
    UnresolvedSubWorkflow {
        step: StepId,
        workflow: WorkflowId,
        selector: String,
        searched: String,
        /// Workflows on the call path to the step's workflow, outermost first.
        via: Vec<WorkflowId>,
    },
    #[error("sub-workflow cycle {}: a workflow may not call itself, directly or through others", arrow(.path))]
    SubWorkflowCycle { path: Vec<WorkflowId> },
    #[error(
        "sub-workflow chain {} is {} levels deep, over the kernel limit of {limit}: flatten it",
        arrow(.path), depth_of(.path)
    )]
    SubWorkflowTooDeep { path: Vec<WorkflowId>, limit: usize },
    #[error("step `{step}` runs workflow `{workflow}` ({version}), which is not valid:{}", nested(.errors))]
    SubWorkflowInvalid {
        step: StepId,
        workflow: WorkflowId,
        version: WorkflowVersion,
        errors: Vec<ValidationError>,
    },

    // ── shadow evaluation ────────────────────────────────────────────────
    #[error(
        "the workflow must be shadow-evaluable but these uses could reach outside the sandbox:{}\n  Replace them with pure or idempotent tools confined to the sandbox, or drop `shadow_evaluable`.",
        ineligible(.steps)
    )]
    ShadowIneligible { steps: Vec<IneligibleStep> },
}

impl ValidationError {
    /// The stable code of this error (its variant, snake_case).
    pub fn code(&self) -> ValidationCode {
        ValidationCode::from(self)
    }
}

impl ValidationCode {
    /// The code as written in JSON (`duplicate_step_id`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for ValidationCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
