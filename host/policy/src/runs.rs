//! What the policy says of workflows and their runs, beside what it grants
//! plugins: which workflows may start and from where, the durability a
//! workflow gets when it does not say, what judgments may ask and what
//! happens when nobody answers, and the bounds on retries and outputs
//! (seed 003, "Config": the one policy authority).
//!
//! Plain data with defaults that change nothing (every workflow enabled,
//! custom definitions allowed, durable by default, no bounds beyond the
//! validator's). Parsing lives with the rest of the file in `policy.rs`;
//! enforcing is the host's and the executor's.

use std::collections::BTreeSet;
use std::time::Duration;

use poimen_workflow::JudgmentFallback;

/// What a workflow that does not say `durable` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DurabilityDefault {
    /// Its runs are kept in the store, each step durable before the next.
    #[default]
    Durable,
    /// Its runs live in memory only and are gone after a restart (the fast
    /// path for recomputable work). A workflow with `durable: true` stays
    /// durable.
    Ephemeral,
}

/// How much effect-free work a durable run may hold unwritten before its
/// next written commit (`[durability] tail-events`, `tail-ms`; `None`: the
/// executor's default). See docs/store.md, "Durable at effects".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnwrittenTail {
    /// Events; `0` writes every commit when it is made.
    pub events: Option<u32>,
    /// Milliseconds the oldest unwritten record may wait.
    pub ms: Option<u32>,
}

/// Which workflows may start, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowRules {
    /// `false`: no workflow may start at all.
    pub enabled: bool,
    /// Only these workflow ids may start (`None`: every id).
    pub enabled_ids: Option<BTreeSet<String>>,
    /// `false`: only published, armed, enabled workflow ids may start —
    /// never a definition a client hands over (a file path, a document).
    pub allow_custom_definitions: bool,
    /// `false`: a workflow whose steps can reach a tool that changes the
    /// world (an idempotent or non-idempotent effect, or an `fs-write`
    /// grant) is refused at load, naming the step.
    pub allow_state_mutations: bool,
}

impl Default for WorkflowRules {
    fn default() -> Self {
        WorkflowRules {
            enabled: true,
            enabled_ids: None,
            allow_custom_definitions: true,
            allow_state_mutations: true,
        }
    }
}

impl WorkflowRules {
    /// Why the workflow `id` may not start under these rules, if it may not.
    pub fn refuses(&self, id: &str) -> Option<String> {
        if !self.enabled {
            return Some(
                "workflows are disabled by the policy (`[workflows] enabled = false`)".into(),
            );
        }
        match &self.enabled_ids {
            Some(ids) if !ids.contains(id) => Some(format!(
                "workflow `{id}` is not among the policy's `[workflows] enabled-ids` ({})",
                ids.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
            _ => None,
        }
    }
}

/// What judgment steps may ask of whom, and what happens without an answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgmentRules {
    /// The executors a judgment step may name (`None`: any).
    pub executors: Option<BTreeSet<String>>,
    /// The profiles a judgment step may name (`None`: any).
    pub profiles: Option<BTreeSet<String>>,
    /// How long a judgment step without its own `timeout` waits (`None`:
    /// until answered).
    pub timeout: Option<Duration>,
    /// What a judgment step without its own `on_timeout` does when its
    /// timeout passes (`None`: it fails).
    pub on_timeout: Option<JudgmentFallback>,
}

/// Bounds every workflow is held to, beyond the validator's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bounds {
    /// Most attempts a step's `retry.max_attempts` may ask for.
    pub max_attempts: Option<u32>,
    /// Longest a step's retry backoff may grow to.
    pub max_backoff: Option<Duration>,
    /// Largest output (canonical JSON bytes) a step or a run may produce;
    /// a larger one fails the step, or the run.
    pub output_bytes: Option<u64>,
}

/// How long the store keeps what finished runs leave behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// `poimen gc` without `--older-than` deletes runs that finished longer
    /// ago than this (`None`: it must be told).
    pub keep_finished: Option<Duration>,
}

/// Everything the policy says of workflows and runs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPolicy {
    pub durability: DurabilityDefault,
    pub tail: UnwrittenTail,
    pub workflows: WorkflowRules,
    pub judgment: JudgmentRules,
    pub bounds: Bounds,
    pub retention: Retention,
}
