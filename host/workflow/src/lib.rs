//! Workflows as data: the IR, its front ends, its canonical form and version,
//! and the load-time validator.
//!
//! This crate does no IO and never panics on bad input: every parse and every
//! check returns its problems as values. It knows nothing of wasmtime, tokio
//! or storage; tools, verifiers and sub-workflows are reached through the
//! registry traits in [`registry`].
#![forbid(unsafe_code)]

pub mod capability;
pub mod ir;
pub mod registry;
pub mod version;

pub use capability::{shadow_eligibility, Capability, EffectClass, Ineligibility};
pub use ir::*;
pub use registry::{
    MemoryRegistry, MemoryWorkflows, Registries, ToolInfo, ToolRegistry, Unresolved,
    UnresolvedWorkflow, VerifierRegistry, WorkflowResolver,
};
pub use version::{VersionParseError, VersionPrefix, WorkflowVersion};
