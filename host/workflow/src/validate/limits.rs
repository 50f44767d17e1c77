//! The validator's limits and id patterns: every numeric bound is its own named constant
//! (seed T3.3: two limits sharing a default once hid a bug), gathered in
//! [`ValidatorLimits`] so a caller — or the constant-audit test — can move
//! exactly one of them.

use crate::ir::Millis;

/// Most steps in one workflow.
pub const MAX_STEPS: usize = 100_000;
/// Most branches of one parallel step.
pub const MAX_PARALLEL_WIDTH: usize = 64;
/// Most attempts of one step (`retry.max_attempts`).
pub const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Longest timeout of one attempt: seven days, so a judgment step can wait
/// for a human.
pub const MAX_STEP_TIMEOUT: Millis = Millis(7 * 24 * 3_600_000);
/// Largest `max_iterations` of a back-edge.
pub const MAX_LOOP_ITERATIONS: u32 = 1_000;
/// Deepest sub-workflow call chain below the workflow being validated.
pub const MAX_SUBWORKFLOW_DEPTH: usize = 8;
/// Largest template (prompt, argument string, key, source), in bytes.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;
/// Largest predicate, in bytes.
pub const MAX_PREDICATE_BYTES: usize = 4 * 1024;
/// Deepest predicate, in levels of its expression tree (a name or a literal
/// is one level; each operator, call, member access or macro around it adds
/// one). CEL is evaluated recursively, and within the byte limit a predicate
/// can nest two thousand levels (`1 + 1 + … + 1`): enough to overflow a
/// worker thread's stack, which aborts the host, when a run evaluates it.
/// An unoptimized build of the evaluator takes about 38 KiB of stack per
/// level, so 32 levels fit a tokio worker's 2 MiB in any build.
pub const MAX_PREDICATE_DEPTH: usize = 32;
/// Most macros (`all`, `exists`, `exists_one`, `map`, `filter`) a predicate
/// nests in one another's bodies. Each runs its body once per element, so
/// nested ones multiply: within the byte limit, four nested over
/// hundred-element lists are 10^8 steps, and CEL has no evaluation budget —
/// the run would hang on its predicate.
pub const MAX_PREDICATE_LOOP_NESTING: usize = 2;

/// Step ids and state keys: usable as template attributes (`steps.fetch`).
pub const STEP_ID_PATTERN: &str = "^[a-z][a-z0-9_]{0,63}$";
/// Workflow ids (and names of workflows exposed as tools): dot-separated
/// segments (`billing.refund`), at most [`MAX_WORKFLOW_ID_LEN`] characters.
pub const WORKFLOW_ID_PATTERN: &str = "^[a-z][a-z0-9_-]*(\\.[a-z][a-z0-9_-]*)*$";
/// Longest workflow id.
pub const MAX_WORKFLOW_ID_LEN: usize = 128;

/// The limits the validator enforces; [`Default`] is the kernel constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidatorLimits {
    pub max_steps: usize,
    pub max_parallel_width: usize,
    pub max_retry_attempts: u32,
    pub max_step_timeout: Millis,
    pub max_loop_iterations: u32,
    pub max_subworkflow_depth: usize,
    pub max_template_bytes: usize,
    pub max_predicate_bytes: usize,
    pub max_predicate_depth: usize,
    pub max_predicate_loop_nesting: usize,
}

impl Default for ValidatorLimits {
    fn default() -> Self {
        ValidatorLimits {
            max_steps: MAX_STEPS,
            max_parallel_width: MAX_PARALLEL_WIDTH,
            max_retry_attempts: MAX_RETRY_ATTEMPTS,
            max_step_timeout: MAX_STEP_TIMEOUT,
            max_loop_iterations: MAX_LOOP_ITERATIONS,
            max_subworkflow_depth: MAX_SUBWORKFLOW_DEPTH,
            max_template_bytes: MAX_TEMPLATE_BYTES,
            max_predicate_bytes: MAX_PREDICATE_BYTES,
            max_predicate_depth: MAX_PREDICATE_DEPTH,
            max_predicate_loop_nesting: MAX_PREDICATE_LOOP_NESTING,
        }
    }
}

/// Whether `s` matches [`STEP_ID_PATTERN`].
pub fn is_step_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
}

/// Whether `s` matches [`WORKFLOW_ID_PATTERN`] and [`MAX_WORKFLOW_ID_LEN`].
pub fn is_workflow_id(s: &str) -> bool {
    s.len() <= MAX_WORKFLOW_ID_LEN
        && s.split('.').all(|seg| {
            let b = seg.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_lowercase()
                && b.iter().all(|&c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-'
                })
        })
}
