//! poimen's WebAssembly plugin host.
//!
//! Owns the wasmtime engine, component loading and its on-disk compile
//! cache, capability policy, per-invocation limits, hostcall records, and
//! the registries of tools and verifiers. It knows nothing of how workflows
//! run or are stored: the executor calls [`PluginHost::invoke_tool`] and
//! [`PluginHost::invoke_verifier`] and keeps the [`HostcallRecord`]s they return.
//!
//! Invariant: there is no path from the host into a guest except through an
//! invocation that produces a record (`describe` at load included).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use poimen_sandbox::{PluginHost, ToolRequest};
//! let host = PluginHost::builder()
//!     .policy_file("poimen-policy.toml")
//!     .plugin_dir("plugins/")
//!     .cache_dir(".poimen/cache")
//!     .build()
//!     .await?;
//! let call = ToolRequest::new("text".parse()?, serde_json::json!({"op": "count", "pattern": "a", "text": "aa"}), "run-1/step-1");
//! let invocation = host.invoke_tool(call).await;
//! println!("{:?} {:?}", invocation.outcome, invocation.record.outcome);
//! # Ok(()) }
//! ```

mod bindings;
mod canonical;
mod engine;
mod error;
mod fs;
mod host;
mod http;
pub mod imports;
pub mod limits;
pub mod record;
mod registry;
mod schema;
mod scratch;
mod sockets;
mod state;

/// The capability policy, read by `poimen-policy`: re-exported whole, so a
/// host's embedder needs no other crate to build one.
pub use poimen_policy as policy;

pub use engine::CacheOutcome;
#[doc(hidden)]
pub use engine::default_engine;
pub use error::{BuildError, GuestLanguage, InvokeError, LoadError, ToolError};
pub use host::{
    AllocatorKind, GuestVerdict, Inspection, Invocation, PluginHost, PluginHostBuilder, Repeatable,
    ToolRequest, VerifierInvocation, VerifierRequest, inspect,
};
pub use host::{Tools, Verifiers};
pub use imports::{Import, ImportClass};
pub use limits::{CallLimits, Resource};
pub use poimen_workflow::{
    Capability, EffectClass, Ineligibility, SchemaViolation, ToolInfo, ToolRef, shadow_eligibility,
};
pub use poimen_workflow::{ToolRegistry, VerifierRegistry};
pub use policy::{Grant, LimitOverrides, Policy, PolicySource};
pub use record::{HostcallRecord, WIT_PACKAGE};
pub use registry::{Entry, PluginKind, RefusedEntry, Replacement, WithheldEntry};
