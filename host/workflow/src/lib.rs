//! Workflows as data: the IR, its front ends, its canonical form and version,
//! and the load-time validator.
//!
//! This crate does no IO and never panics on bad input: every parse and every
//! check returns its problems as values. It knows nothing of wasmtime, tokio
//! or storage; tools, verifiers and sub-workflows are reached through the
//! registry traits in [`registry`].
//!
//! The way a workflow travels: bytes → [`parse`] → [`WorkflowDef`] →
//! [`validate`] → [`Validated`] (publish, arm, run). [`version_of`] names any
//! definition by the Blake3 hash of its [`canonical_bytes`].
#![forbid(unsafe_code)]

mod build;
pub mod canonical;
pub mod capability;
pub mod frontend;
pub mod ir;
pub mod registry;
pub mod shape;
pub mod validate;
pub mod version;

pub use canonical::{
    FromCanonicalError, canonical_bytes, canonicalize, from_canonical, version_of,
};
pub use capability::{Capability, EffectClass, Ineligibility, shadow_eligibility};
pub use frontend::{Format, ParseError, ParseErrorKind, json_schema, parse};
pub use ir::*;
pub use registry::{
    MemoryRegistry, MemoryWorkflows, Registries, ToolInfo, ToolRegistry, Unresolved,
    UnresolvedWorkflow, VerifierRegistry, WorkflowResolver,
};
pub use shape::{BackEdge, Shape};
pub use validate::{
    EligibilityReport, IneligibleStep, SchemaViolation, Site, Validated, ValidationCode,
    ValidationError, ValidatorLimits, eligibility_report, validate, validate_arc,
    validate_for_shadow, validate_with,
};
pub use version::{VersionParseError, VersionPrefix, WorkflowVersion};
