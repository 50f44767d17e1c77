//! poimen's capability policy: what each plugin is granted, and the limits
//! its calls run under.
//!
//! A policy is a TOML file (format in `docs/writing-a-plugin.md`) or a value
//! built in code; [`CallLimits`] are the numbers one guest call runs under,
//! with their defaults. This crate is data and parsing only: it knows
//! nothing of wasmtime, of how a grant is enforced (the sandbox's job), or
//! of workflows' execution — so the host, its tools and the fuzzer can read
//! a policy without building an engine.

pub mod limits;
mod policy;
mod runs;

pub use limits::CallLimits;
pub use policy::*;
pub use runs::{
    Bounds, DurabilityDefault, JudgmentRules, Retention, RunPolicy, UnwrittenTail, WorkflowRules,
};
