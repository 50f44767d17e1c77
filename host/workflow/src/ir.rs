//! The workflow IR: the one validated shape every front end parses into.
//!
//! This module owns the *types* of a workflow definition and the read-only
//! helpers over them (`step`, `start_steps`, `dependents`, `topo_order`,
//! `is_long_lived`). It deliberately knows nothing about source text (no
//! spans, no YAML/JSON quirks — those stay in `frontend`), nothing about IO,
//! and nothing about execution. Convenience constructors live in `build`.
//!
//! # Execution model the types encode
//!
//! * `steps` is a set keyed by [`StepId`]; its order in a source file has no
//!   meaning (the canonicalizer sorts it by id).
//! * `transitions` are dependency edges `from -> to`: `to` becomes ready once
//!   every forward predecessor has finished. Ready steps run **one at a time**
//!   in a deterministic topological order (ties broken by step id). Fan-out is
//!   never inferred: only a [`StepKind::Parallel`] step runs work concurrently.
//! * A transition with `max_iterations` is a *back-edge* (a bounded loop): when
//!   `from` finishes and `when` holds (or is absent), the steps between `to`
//!   and `from` run again, at most `max_iterations` extra times. A transition
//!   without `max_iterations` is a forward edge, and forward edges must form a
//!   DAG — an unbounded loop cannot be expressed as valid.
//! * [`StepKind::Parallel`] branches and [`StepKind::Conditional`] targets are
//!   *owned* steps: their owner runs them (concurrently for `Parallel`, the one
//!   chosen for `Conditional`); they take part in no transition themselves.
//!   The owner's output is the owned steps' result. Steps owned by no step are
//!   *top-level*.
//! * Templates (prompts, arguments) and predicates read recorded run state
//!   only: `inputs`, declared `state`, and `steps.<id>.output` of top-level
//!   steps that ran before them on every path (the forward ancestors of the
//!   top-level step that contains the reader).
//!
//! # Ordered and unordered collections
//!
//! Sets (order is not meaning, the canonical form sorts them): `steps`,
//! `transitions`, a step's `tools` and `verify`, `retry.on`,
//! `rubric.criteria` (of the workflow and of each step), `state`, and the
//! keys of every JSON object.
//! Sequences (order is meaning, kept as written): `Parallel.branches` (the
//! order writes are applied at the join), judgment `sources` and
//! `constraints` (the order they are shown to the judge), and JSON arrays.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::version::WorkflowVersion;

/// Format version of the workflow document (`schema: 1`).
pub const CURRENT_SCHEMA: SchemaVersion = SchemaVersion(1);

/// Timeout of one attempt of a step when the step does not declare one.
pub const DEFAULT_STEP_TIMEOUT: Millis = Millis(60_000);

/// Builds a [`Schema`] from a JSON object literal without a panic path.
pub(crate) fn schema_object(v: Value) -> Schema {
    match v {
        Value::Object(m) => Schema::from(m),
        Value::Bool(b) => Schema::from(b),
        _ => Schema::default(),
    }
}

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident, $pattern:expr, $desc:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// The id as written.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }

        impl From<&$name> for $name {
            fn from(s: &$name) -> Self {
                s.clone()
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                schema_object(serde_json::json!({
                    "type": "string",
                    "pattern": $pattern,
                    "description": $desc,
                }))
            }
        }
    };
}

string_id!(
    /// Name of a workflow, stable across its versions (`billing.refund`).
    /// The validator enforces [`crate::validate::WORKFLOW_ID_PATTERN`].
    WorkflowId,
    "^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$",
    "Workflow name: dot-separated segments of lower-case letters, digits, `_` and `-`, each starting with a letter; at most 128 characters."
);
string_id!(
    /// Author-assigned step id, stable across versions (`classify`). The
    /// validator enforces [`crate::validate::STEP_ID_PATTERN`], which makes
    /// every id usable as a template attribute (`steps.classify.output`).
    StepId,
    "^[a-z][a-z0-9_]{0,63}$",
    "Step id: a lower-case letter, then up to 63 lower-case letters, digits or `_`."
);
string_id!(
    /// A declared run-state variable (same pattern as a step id: it is read
    /// as `state.<key>` in templates).
    StateKey,
    "^[a-z][a-z0-9_]{0,63}$",
    "State key: a lower-case letter, then up to 63 lower-case letters, digits or `_`."
);

/// Version of the workflow document format itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaVersion(pub u32);

impl Default for SchemaVersion {
    fn default() -> Self {
        CURRENT_SCHEMA
    }
}

impl JsonSchema for SchemaVersion {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("SchemaVersion")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema_object(serde_json::json!({
            "type": "integer",
            "const": CURRENT_SCHEMA.0,
            "description": "Format version of the document; 1.",
        }))
    }
}

/// A duration in whole milliseconds. Written in documents either as an
/// integer number of milliseconds or as a string with a unit (`"250ms"`,
/// `"30s"`, `"5m"`, `"2h"`); always serialized canonically as an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    /// As a [`std::time::Duration`].
    pub fn as_duration(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }

    /// `n` seconds.
    pub const fn secs(n: u64) -> Millis {
        Millis(n.saturating_mul(1_000))
    }

    /// Parses `"250ms"`, `"30s"`, `"5m"`, `"2h"` or a bare integer (milliseconds).
    pub fn parse(s: &str) -> Result<Millis, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            format!("`{s}` is not a duration; write e.g. `500ms`, `30s`, `5m` or `2h`")
        })?;
        let factor = match unit.trim() {
            "" | "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            other => {
                return Err(format!(
                    "unknown duration unit `{other}` in `{s}`; use ms, s, m or h"
                ));
            }
        };
        n.checked_mul(factor)
            .map(Millis)
            .ok_or_else(|| format!("duration `{s}` is too large"))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Millis;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: whole milliseconds, or a string such as `500ms`, `30s`, `5m`, `2h`")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Millis, E> {
                Ok(Millis(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Millis, E> {
                u64::try_from(n)
                    .map(Millis)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Millis, E> {
                Millis::parse(s).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Millis {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("Duration")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema_object(serde_json::json!({
            "description": "A duration: whole milliseconds, or a string with a unit (`500ms`, `30s`, `5m`, `2h`).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": "^\\s*[0-9]+\\s*(ms|s|m|h)?\\s*$" }
            ]
        }))
    }
}

fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

/// A whole workflow definition: the IR.
///
/// Deserializing goes through the front end's strict document shape (unknown
/// fields rejected, exactly one kind per step: the `Deserialize` impl lives
/// in `frontend/doc.rs`); prefer [`crate::parse`], which also reports file,
/// line and column.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowDef {
    /// Stable name of the workflow.
    pub id: WorkflowId,
    /// Document format version.
    pub schema: SchemaVersion,
    /// What the workflow is for. Meaning: see the decision at the canonicalizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema the run input must satisfy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
    /// JSON Schema the run output must satisfy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Value>,
    /// How the run's output is built from its final state; by default the
    /// output of the last top-level step that ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<ArgTemplate>,
    /// Scheduling weight under contention.
    #[serde(skip_serializing_if = "is_default")]
    pub priority: Priority,
    /// How many runs may be active at once, and what happens past that.
    #[serde(skip_serializing_if = "is_default")]
    pub concurrency: Concurrency,
    /// Template of the logical thing a run is about (`"{{ inputs.account }}"`).
    /// It may read `inputs` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Template>,
    /// Durability class: `Some(false)` keeps runs in memory only (gone
    /// after a restart), `Some(true)` makes them durable whatever the
    /// host's default; `None` takes the host's default (the policy file's
    /// `durability.work`), resolved before the workflow runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// What happens to live runs of this version when another version of
    /// its workflow is armed, or the workflow is disarmed.
    #[serde(skip_serializing_if = "is_default")]
    pub unload: Unload,
    /// Declared run variables and how concurrent writes to them combine.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub state: BTreeMap<StateKey, StateDecl>,
    /// Structural limits of one run.
    #[serde(skip_serializing_if = "is_default")]
    pub limits: Limits,
    /// Expose this workflow as a tool (MCP and the tool registry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<WorkflowTool>,
    /// The workflow declares it must be eligible for shadow evaluation; it is
    /// rejected at load when any step could reach outside the sandbox.
    #[serde(skip_serializing_if = "is_default")]
    pub shadow_evaluable: bool,
    /// The steps, a set keyed by id.
    pub steps: Vec<StepDef>,
    /// Dependency edges and bounded back-edges between top-level steps.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transitions: Vec<Transition>,
    /// How a run's result is judged (shadow evaluation, scoring).
    #[serde(skip_serializing_if = "is_default")]
    pub rubric: RubricDef,
    /// Cost budget of one run.
    #[serde(skip_serializing_if = "is_default")]
    pub budget: BudgetDef,
}

/// Retirement of a version's live runs (seed 002, `unload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Unload {
    /// What to do with the runs.
    #[serde(default, skip_serializing_if = "is_default")]
    pub policy: UnloadPolicy,
    /// For `drain`: how long runs may go on before they are cancelled;
    /// absent, they may finish whenever they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Millis>,
}

/// What [`Unload`] does with a retired version's live runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnloadPolicy {
    /// Let them finish (within `timeout`, if one is given; then cancel).
    #[default]
    Drain,
    /// Cancel them now, each cancel recorded.
    Cancel,
    /// Leave them running on the version they pinned.
    Detach,
}

/// What a judgment step does when no answer came within its timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum JudgmentFallback {
    /// The step fails.
    Fail,
    /// This answer is taken, as if given (it must satisfy the result schema).
    Answer(Value),
    /// The request is asked again of another executor or profile, once, with
    /// the same timeout; if that one expires too, the step fails.
    Escalate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        executor: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
    },
}

/// Scheduling weight: a tiebreak under scarcity, not a reservation.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
}

/// Admission control for runs of one workflow.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    /// Maximum active runs in the scope; `None` is unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u32>,
    /// Whether `max_runs` counts all runs of the workflow or runs with the same key.
    #[serde(default, skip_serializing_if = "is_default")]
    pub scope: ConcurrencyScope,
    /// What a run arriving over the limit does.
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_overflow: Overflow,
}

/// What `concurrency.max_runs` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConcurrencyScope {
    /// All active runs of the workflow.
    #[default]
    Workflow,
    /// Active runs with the same rendered `key`.
    Key,
}

/// What a run arriving over `concurrency.max_runs` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Wait for a slot.
    #[default]
    Queue,
    /// Refuse the new run.
    Drop,
    /// Cancel the oldest active run in the scope and admit the new one.
    Replace,
}

/// A declared run variable.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateDecl {
    /// JSON Schema of the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// How writes combine. Absent means `overwrite`, and is only allowed for a
    /// key no two parallel branches write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reducer: Option<Reducer>,
}

/// How a write combines with the current value of a state key. Writes of
/// parallel branches are applied in branch declaration order at the join, so
/// every reducer gives the same state whatever order the branches finish in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    /// The write replaces the value.
    #[default]
    Overwrite,
    /// The value is a list; the write is appended (a list write is appended element-wise).
    Append,
    /// The value is an object; the write's keys are merged in (shallow).
    Merge,
    /// The value is a list without duplicates, kept sorted by canonical JSON.
    Union,
}

/// Structural limits of one run (distinct from the cost [`BudgetDef`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Maximum step executions (loop iterations count each time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Maximum tokens of a single model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Time from the run's start after which it fails, waiting included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Millis>,
}

/// Expose a workflow as a tool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowTool {
    /// Tool name; defaults to the workflow id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Description shown to callers (agents read it: it is meaning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// One step.
///
/// Deserializing goes through the front end's strict step shape: exactly one
/// of the kind keys (`model`, `tool`, `parallel`, `conditional`, `workflow`,
/// `judgment`), no unknown fields (the impl lives in `frontend/doc.rs`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepDef {
    /// Author-assigned, stable across versions.
    pub id: StepId,
    /// What the step does. Serialized as one key named after the kind.
    #[serde(flatten)]
    pub kind: StepKind,
    /// Tools this step may use beyond its own kind (offered to a model step).
    #[serde(skip_serializing_if = "ToolSelector::is_empty")]
    pub tools: ToolSelector,
    /// Verifiers run after every attempt; a failing verdict fails the attempt.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verify: Vec<VerifierRef>,
    /// Weighted criteria scored after every attempt (after `verify`): a
    /// score below the threshold — or, without one, any failing criterion —
    /// fails the attempt as a verifier rejection. Empty: no rubric.
    #[serde(skip_serializing_if = "is_default")]
    pub rubric: RubricDef,
    /// Serial retry of failed attempts.
    #[serde(skip_serializing_if = "is_default")]
    pub retry: RetryPolicy,
    /// Timeout of one attempt; [`DEFAULT_STEP_TIMEOUT`] when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Millis>,
    /// State key the step's output is written to, through the key's reducer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes: Option<StateKey>,
}

impl StepDef {
    /// The attempt timeout in effect.
    pub fn effective_timeout(&self) -> Millis {
        self.timeout.unwrap_or(DEFAULT_STEP_TIMEOUT)
    }

    /// The steps this step owns: a Parallel's branches in order, or a
    /// Conditional's `then` and `otherwise`. Empty for other kinds.
    pub fn owned(&self) -> Vec<&StepId> {
        match &self.kind {
            StepKind::Parallel(p) => p.branches.iter().collect(),
            StepKind::Conditional(c) => std::iter::once(&c.then)
                .chain(c.otherwise.as_ref())
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The six kinds of step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Ask a model.
    Model(ModelStep),
    /// Call a tool (a WebAssembly component) through the intent wrapper.
    Tool(ToolStep),
    /// Run owned branch steps concurrently and join them.
    Parallel(ParallelStep),
    /// Run one of two owned steps, chosen by a predicate over recorded state.
    Conditional(ConditionalStep),
    /// Run another workflow version as a child run.
    #[serde(rename = "workflow")]
    SubWorkflow(SubWorkflowStep),
    /// Pause until an external judge returns a result matching a schema.
    Judgment(JudgmentStep),
}

impl StepKind {
    /// The names of the kinds as written in documents, in declaration order.
    pub const NAMES: [&'static str; 6] = [
        "model",
        "tool",
        "parallel",
        "conditional",
        "workflow",
        "judgment",
    ];

    /// Lower-case name of the kind as written in documents.
    pub fn name(&self) -> &'static str {
        match self {
            StepKind::Model(_) => "model",
            StepKind::Tool(_) => "tool",
            StepKind::Parallel(_) => "parallel",
            StepKind::Conditional(_) => "conditional",
            StepKind::SubWorkflow(_) => "workflow",
            StepKind::Judgment(_) => "judgment",
        }
    }
}

/// Ask a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelStep {
    /// The user prompt. Hashes as written: prompt text is semantic.
    pub prompt: PromptTemplate,
    /// Optional system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<PromptTemplate>,
    /// Reasoning effort, mapped to the provider's setting where it has one.
    #[serde(default, skip_serializing_if = "is_default")]
    pub effort: ReasoningEffort,
    /// Whether the output is free text or must parse as JSON.
    #[serde(default, skip_serializing_if = "is_default")]
    pub format: OutputFormat,
    /// JSON Schema the answer must satisfy (it must also parse as JSON, so
    /// this needs `format: json`); no check when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Model name override; the provider's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// How hard a model should think.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    Low,
    #[default]
    Medium,
    High,
}

/// What a model step's output must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Free text.
    #[default]
    Text,
    /// The output must parse as JSON.
    Json,
}

/// Call a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolStep {
    /// Which tool, by name and semver range (written `name:` in documents).
    #[serde(rename = "name")]
    pub tool: ToolRef,
    /// Arguments: JSON whose strings are templates.
    #[serde(default, skip_serializing_if = "ArgTemplate::is_null")]
    pub args: ArgTemplate,
}

/// Run owned branch steps concurrently and join them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParallelStep {
    /// Owned steps run concurrently. Order is the order writes are applied
    /// at the join, so it is meaning and is not sorted.
    pub branches: Vec<StepId>,
    /// When the fan-out is done.
    #[serde(default, skip_serializing_if = "is_default")]
    pub join: JoinPolicy,
}

/// When a fan-out is done, and what the losers become.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum JoinPolicy {
    /// Every branch must succeed.
    #[default]
    All,
    /// The first branch to succeed wins; the others are cancelled (`lost`).
    Any,
    /// The first `n` branches to succeed win; the others are cancelled (`lost`).
    Quorum(u32),
}

impl Serialize for JoinPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            JoinPolicy::All => s.serialize_str("all"),
            JoinPolicy::Any => s.serialize_str("any"),
            JoinPolicy::Quorum(n) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("quorum", n)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for JoinPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JoinPolicy;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a join policy: `all`, `any` or `{quorum: N}`")
            }
            fn visit_str<E: serde::de::Error>(self, w: &str) -> Result<JoinPolicy, E> {
                match w {
                    "all" => Ok(JoinPolicy::All),
                    "any" => Ok(JoinPolicy::Any),
                    other => Err(E::unknown_variant(other, &["all", "any", "quorum"])),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<JoinPolicy, A::Error> {
                let mut quorum: Option<u32> = None;
                while let Some(k) = m.next_key::<String>()? {
                    if k != "quorum" {
                        return Err(serde::de::Error::unknown_field(&k, &["quorum"]));
                    }
                    if quorum.is_some() {
                        return Err(serde::de::Error::duplicate_field("quorum"));
                    }
                    quorum = Some(m.next_value()?);
                }
                quorum
                    .map(JoinPolicy::Quorum)
                    .ok_or_else(|| serde::de::Error::missing_field("quorum"))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for JoinPolicy {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("JoinPolicy")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema_object(serde_json::json!({
            "description": "When a fan-out is done: `all` branches succeed, `any` one succeeds, or a `quorum` of N succeed (the others are cancelled).",
            "oneOf": [
                { "type": "string", "enum": ["all", "any"] },
                {
                    "type": "object",
                    "properties": { "quorum": { "type": "integer", "minimum": 1 } },
                    "required": ["quorum"],
                    "additionalProperties": false
                }
            ]
        }))
    }
}

/// Run one of two owned steps, chosen by a predicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConditionalStep {
    /// CEL predicate over `inputs`, `state` and `steps`.
    pub on: Predicate,
    /// Owned step run when the predicate is true.
    pub then: StepId,
    /// Owned step run when it is false; nothing runs when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otherwise: Option<StepId>,
}

/// Run another workflow as a child run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubWorkflowStep {
    /// The child workflow.
    pub id: WorkflowId,
    /// Which version of it; resolved to a hash before the run starts.
    #[serde(default, skip_serializing_if = "is_default")]
    pub version: VersionSelector,
    /// The child run's input: JSON whose strings are templates.
    #[serde(default, skip_serializing_if = "ArgTemplate::is_null")]
    pub input: ArgTemplate,
}

/// Which version of a sub-workflow.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum VersionSelector {
    /// The newest published version of the workflow id, resolved when the
    /// parent is published or armed.
    #[default]
    Latest,
    /// Exactly this version.
    Pinned(WorkflowVersion),
}

impl fmt::Display for VersionSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionSelector::Latest => f.write_str("latest"),
            VersionSelector::Pinned(v) => write!(f, "{v}"),
        }
    }
}

impl Serialize for VersionSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VersionSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "latest" {
            return Ok(VersionSelector::Latest);
        }
        s.parse::<WorkflowVersion>()
            .map(VersionSelector::Pinned)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for VersionSelector {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("VersionSelector")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema_object(serde_json::json!({
            "description": "`latest`, or an exact version `b3:` + 64 hex digits.",
            "type": "string",
            "pattern": "^(latest|b3:[0-9a-f]{64})$"
        }))
    }
}

/// Pause the run until an external judge answers (seed 003).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgmentStep {
    /// What the judge is asked.
    pub question: PromptTemplate,
    /// Material the judge must consider, in order; each rendered and hashed
    /// into the request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Template>,
    /// JSON Schema the judge's result must satisfy.
    pub result_schema: Value,
    /// Which executor is expected to answer (e.g. `human`, `ai-collab`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// Which profile of that executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Constraints stated to the judge, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<String>,
    /// What happens when the step's `timeout` passes without an answer;
    /// absent, the host's policy decides (`judgment.on-timeout`, by default
    /// `fail`). A judgment step without a `timeout` waits as long as the
    /// policy's `judgment.timeout-ms`, or forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<JudgmentFallback>,
}

/// An edge between top-level steps.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Transition {
    pub from: StepId,
    pub to: StepId,
    /// Present on a back-edge (a loop): how many extra times the loop body may
    /// run. Forward edges have none; a cycle of forward edges is invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<NonZeroU32>,
    /// On a back-edge: loop again only while this predicate holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Predicate>,
}

impl Transition {
    /// Whether this is a bounded back-edge (a loop) rather than a dependency.
    pub fn is_back_edge(&self) -> bool {
        self.max_iterations.is_some()
    }
}

/// A tool or verifier reference: a name and a semver range, written
/// `name` or `name@range` (`text@^0.1`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolRef {
    pub name: String,
    pub version: semver::VersionReq,
}

impl ToolRef {
    /// A reference to any version of `name`.
    pub fn any(name: impl Into<String>) -> Self {
        ToolRef {
            name: name.into(),
            version: semver::VersionReq::STAR,
        }
    }

    /// Parses `name` or `name@range`.
    pub fn parse(s: &str) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for ToolRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.version == semver::VersionReq::STAR {
            f.write_str(&self.name)
        } else {
            write!(f, "{}@{}", self.name, self.version)
        }
    }
}

impl std::str::FromStr for ToolRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('@') {
            None => Ok(ToolRef::any(s)),
            Some((name, req)) => {
                let version = semver::VersionReq::parse(req).map_err(|e| {
                    format!("`{s}`: `{req}` is not a semver range ({e}); write e.g. `{name}@^0.1`")
                })?;
                Ok(ToolRef {
                    name: name.to_owned(),
                    version,
                })
            }
        }
    }
}

impl Serialize for ToolRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ToolRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ToolRef {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("ToolRef")
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema_object(serde_json::json!({
            "description": "A tool or verifier: `name` (any version) or `name@range` with a semver range (`text@^0.1`).",
            "type": "string",
            "minLength": 1
        }))
    }
}

impl PartialOrd for ToolRef {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ToolRef {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name
            .cmp(&other.name)
            .then_with(|| self.version.to_string().cmp(&other.version.to_string()))
    }
}

/// Tools a step may use beyond its own kind: a set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ToolSelector(pub Vec<ToolRef>);

impl ToolSelector {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A verifier reference with its configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifierRef {
    pub verifier: ToolRef,
    /// Passed to the verifier as its configuration.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub config: Value,
}

/// Serial retry of a step's attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, including the first (1 = no retry).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub max_attempts: u32,
    /// Delay before the second attempt.
    #[serde(default, skip_serializing_if = "is_default")]
    pub backoff: Millis,
    /// Each later delay is the previous one times this factor.
    #[serde(default = "two", skip_serializing_if = "is_two")]
    pub factor: u32,
    /// Upper bound of one delay; unbounded when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff: Option<Millis>,
    /// Which failures are retried (a set). Default: all of them.
    #[serde(default = "RetryOn::all", skip_serializing_if = "RetryOn::is_all")]
    pub on: Vec<RetryOn>,
}

fn one() -> u32 {
    1
}
fn is_one(n: &u32) -> bool {
    *n == 1
}
fn two() -> u32 {
    2
}
fn is_two(n: &u32) -> bool {
    *n == 2
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            backoff: Millis(0),
            factor: 2,
            max_backoff: None,
            on: RetryOn::all(),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt `attempt` (1-based; attempt 1 has none).
    pub fn delay_before(&self, attempt: u32) -> Millis {
        if attempt <= 1 {
            return Millis(0);
        }
        let mut d = self.backoff.0;
        for _ in 2..attempt {
            d = d.saturating_mul(u64::from(self.factor));
        }
        match self.max_backoff {
            Some(max) => Millis(d.min(max.0)),
            None => Millis(d),
        }
    }

    /// Whether a failure of this class is retried.
    pub fn retries(&self, class: RetryOn) -> bool {
        self.on.contains(&class)
    }
}

/// A class of attempt failure.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The tool or model reported failure.
    Failed,
    /// A dependency was unavailable.
    Unavailable,
    /// The attempt timed out.
    Timeout,
    /// A verifier rejected the output.
    Verifier,
}

impl RetryOn {
    /// Every class, in declaration order.
    pub fn all() -> Vec<RetryOn> {
        vec![
            RetryOn::Failed,
            RetryOn::Unavailable,
            RetryOn::Timeout,
            RetryOn::Verifier,
        ]
    }

    /// Whether `v`, as a set, is every class.
    pub fn is_all(v: &[RetryOn]) -> bool {
        let all = RetryOn::all();
        all.iter().all(|c| v.contains(c)) && v.iter().all(|c| all.contains(c))
    }

    /// The word used in documents.
    pub fn name(self) -> &'static str {
        match self {
            RetryOn::Failed => "failed",
            RetryOn::Unavailable => "unavailable",
            RetryOn::Timeout => "timeout",
            RetryOn::Verifier => "verifier",
        }
    }
}

/// How a result is judged: weighted verifier criteria. At the top level it
/// judges a run's result; on a step ([`StepDef::rubric`]), each attempt's
/// output.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RubricDef {
    /// The criteria, a set keyed by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub criteria: Vec<Criterion>,
    /// Weighted score in 0..=1 a result needs to pass; absent means every
    /// criterion must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

/// One rubric criterion: a verifier run on the run's result, with its
/// configuration and relative weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Criterion {
    pub name: String,
    pub verifier: ToolRef,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub config: Value,
    /// Relative weight (finite, > 0).
    #[serde(default = "unit_weight", skip_serializing_if = "is_unit_weight")]
    pub weight: f64,
}

pub(crate) fn unit_weight() -> f64 {
    1.0
}
fn is_unit_weight(w: &f64) -> bool {
    *w == 1.0
}

/// The cost budget of one run; exceeding any part fails the run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetDef {
    /// Model tokens (in + out) over the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Tool invocations over the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// Time spent executing (waiting for a judgment excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time: Option<Millis>,
}

/// A minijinja template producing text. Hashes exactly as written.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct PromptTemplate(pub String);

/// A minijinja template producing text (keys, sources).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct Template(pub String);

/// JSON whose string leaves are minijinja templates. A string that is exactly
/// one `{{ expression }}` yields the expression's JSON value, not its text.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ArgTemplate(pub Value);

impl ArgTemplate {
    pub fn is_null(&self) -> bool {
        self.0.is_null()
    }
}

/// A CEL expression over recorded state (`inputs`, `state`, `steps`).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
pub struct Predicate(pub String);

impl From<&str> for PromptTemplate {
    fn from(s: &str) -> Self {
        PromptTemplate(s.to_owned())
    }
}
impl From<String> for PromptTemplate {
    fn from(s: String) -> Self {
        PromptTemplate(s)
    }
}
impl From<&str> for Template {
    fn from(s: &str) -> Self {
        Template(s.to_owned())
    }
}
impl From<String> for Template {
    fn from(s: String) -> Self {
        Template(s)
    }
}
impl From<&str> for Predicate {
    fn from(s: &str) -> Self {
        Predicate(s.to_owned())
    }
}
impl From<String> for Predicate {
    fn from(s: String) -> Self {
        Predicate(s)
    }
}
impl From<Value> for ArgTemplate {
    fn from(v: Value) -> Self {
        ArgTemplate(v)
    }
}

/// Read-only helpers over the definition. The ones that need the shape
/// (ready order, owners, dependents) are in `shape.rs`, beside the one
/// implementation of it.
impl WorkflowDef {
    /// The step with this id (the first one, if ids repeat).
    pub fn step(&self, id: &str) -> Option<&StepDef> {
        self.steps.iter().find(|s| s.id.as_str() == id)
    }

    /// Dependency edges (transitions without `max_iterations`).
    pub fn forward_transitions(&self) -> impl Iterator<Item = &Transition> {
        self.transitions.iter().filter(|t| !t.is_back_edge())
    }

    /// Bounded loops (transitions with `max_iterations`).
    pub fn back_edges(&self) -> impl Iterator<Item = &Transition> {
        self.transitions.iter().filter(|t| t.is_back_edge())
    }

    /// Whether a run of this workflow can wait on an external event: it has a
    /// [`StepKind::Judgment`] step, which pauses the run until a judge answers.
    ///
    /// This looks at this definition only; sub-workflows are known only once
    /// resolved — see [`crate::Validated::is_long_lived`], which includes them.
    pub fn is_long_lived(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.kind, StepKind::Judgment(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(from: &str, to: &str) -> Transition {
        Transition {
            from: from.into(),
            to: to.into(),
            max_iterations: None,
            when: None,
        }
    }

    #[test]
    fn topo_order_breaks_ties_by_id_and_skips_owned_steps() {
        let wf = WorkflowDef::new("w")
            .with_step(StepDef::model("zeta", "z"))
            .with_step(StepDef::model("alpha", "a"))
            .with_step(StepDef::parallel("fan", ["b1", "b2"]))
            .with_step(StepDef::model("b1", "x"))
            .with_step(StepDef::model("b2", "y"))
            .with_step(StepDef::model("mid", "m"))
            .with_transition(t("alpha", "mid"))
            .with_transition(t("zeta", "mid"))
            .with_transition(t("mid", "fan"));
        let order: Vec<&str> = wf.topo_order().into_iter().map(StepId::as_str).collect();
        assert_eq!(order, ["alpha", "zeta", "mid", "fan"]);
        let starts: Vec<&str> = wf.start_steps().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(starts, ["alpha", "zeta"]);
        let deps: Vec<&str> = wf
            .dependents("alpha")
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(deps, ["mid"]);
        assert_eq!(wf.owner_of("b2").map(|s| s.id.as_str()), Some("fan"));
        assert!(!wf.is_long_lived());
    }

    #[test]
    fn topo_order_puts_cyclic_steps_last() {
        let wf = WorkflowDef::new("w")
            .with_step(StepDef::model("a", "a"))
            .with_step(StepDef::model("b", "b"))
            .with_step(StepDef::model("c", "c"))
            .with_transition(t("b", "c"))
            .with_transition(t("c", "b"));
        let order: Vec<&str> = wf.topo_order().into_iter().map(StepId::as_str).collect();
        assert_eq!(order, ["a", "b", "c"]);
    }

    #[test]
    fn judgment_makes_a_workflow_long_lived() {
        let wf = WorkflowDef::new("w").with_step(StepDef::judgment(
            "ok",
            "Approve?",
            serde_json::json!({"type": "boolean"}),
        ));
        assert!(wf.is_long_lived());
    }

    #[test]
    fn millis_parses_units_and_rejects_nonsense() {
        assert_eq!(Millis::parse("250ms"), Ok(Millis(250)));
        assert_eq!(Millis::parse("30s"), Ok(Millis(30_000)));
        assert_eq!(Millis::parse("2h"), Ok(Millis(7_200_000)));
        assert_eq!(Millis::parse(" 5 m "), Ok(Millis(300_000)));
        assert!(Millis::parse("5d").is_err());
        assert!(Millis::parse("").is_err());
        assert!(Millis::parse("99999999999999999999h").is_err());
    }
}
