//! The plugin host: one value that loads components into its registries
//! and invokes tools and verifiers behind the recorded hostcall boundary.
//!
//! The rooms: the request and result types (`call.rs`), building a host
//! (`builder.rs`), loading a component and checking its capabilities
//! (`load.rs`), running one guest call and classifying how it ended
//! (`guest.rs`), and the public invocations (`invoke.rs`). Every call into
//! a guest goes through [`PluginHost::run_guest`](guest.rs), which builds a
//! fresh store from the invocation's grants and limits, runs the call under
//! the wall-clock timeout, and returns what the record needs. This module
//! knows nothing of workflows: a call arrives with its arguments and
//! idempotency key already decided.

mod builder;
mod call;
mod guest;
mod invoke;
mod load;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use poimen_workflow::{ToolInfo, ToolRef, ToolRegistry, Unresolved, VerifierRegistry};
use wasmtime::Engine;
use wasmtime::component::Linker;

pub use builder::PluginHostBuilder;
pub use call::{
    GuestVerdict, Inspection, Invocation, Repeatable, ToolRequest, VerifierInvocation,
    VerifierRequest,
};
pub use load::inspect;

pub use crate::engine::AllocatorKind;
use crate::engine::CompileCache;
use crate::error::InvokeError;
use crate::limits::CallLimits;
use crate::policy::Policy;
use crate::registry::{Entry, PluginKind, Registry};
use crate::state::CallState;

/// The plugin host. Cheap to clone; `Send + Sync`; every invocation runs in
/// its own store, so any number can run at once (up to the concurrency
/// limit, beyond which they wait).
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    allocator: AllocatorKind,
    linker: Linker<CallState>,
    cache: CompileCache,
    policy: Policy,
    base_limits: CallLimits,
    registry: RwLock<Registry>,
    /// Where calls' scratch directories are made.
    scratch: crate::scratch::ScratchRoot,
    slots: tokio::sync::Semaphore,
    in_flight: AtomicUsize,
    /// Components this host compiled (not read from the compile cache).
    compiles: AtomicUsize,
    /// Notified whenever a guest call ends (its instances back in the pool).
    released: tokio::sync::Notify,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("allocator", &self.inner.allocator)
            .field("policy", self.inner.policy.source())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl PluginHost {
    /// The tool registry.
    pub fn tools(&self) -> Tools {
        Tools(self.clone())
    }

    /// The verifier registry.
    pub fn verifiers(&self) -> Verifiers {
        Verifiers(self.clone())
    }

    /// The policy the host consults.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// How instances are allocated (pooling unless the pool could not be
    /// reserved).
    pub fn allocator(&self) -> AllocatorKind {
        self.inner.allocator
    }

    /// Guest calls running right now. Falls back to zero promptly when an
    /// invocation's future is dropped.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// How many components this host has compiled since it was built
    /// (loads, replacements and inspections that missed the compile cache
    /// or had none). A start whose components are all in the cache — or
    /// withheld as before — compiles none.
    pub fn compiles(&self) -> usize {
        self.inner.compiles.load(Ordering::Relaxed)
    }

    pub(crate) fn with_registry<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        f(&self
            .inner
            .registry
            .read()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Components withheld at build for want of a grant (see
    /// [`PluginHostBuilder::withhold_ungranted`]).
    pub fn withheld(&self) -> Vec<crate::registry::WithheldEntry> {
        self.with_registry(|r| r.withheld())
    }

    /// Components from plugin directories refused at build in tolerant
    /// mode ([`PluginHostBuilder::withhold_ungranted`]): the host started
    /// without them.
    pub fn refused(&self) -> Vec<crate::registry::RefusedEntry> {
        self.with_registry(|r| r.refused())
    }

    fn registry_mut<T>(&self, f: impl FnOnce(&mut crate::registry::Registry) -> T) -> T {
        f(&mut self
            .inner
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner))
    }

    pub(super) fn reserve(&self, name: &str, origin: &str) {
        self.registry_mut(|r| r.reserve(name, origin));
    }

    pub(super) fn refuse(&self, entry: crate::registry::RefusedEntry) {
        self.registry_mut(|r| r.refuse(entry));
    }
}

/// The tool registry of a [`PluginHost`]: resolves references for the validator
/// and lists what is loaded.
#[derive(Debug, Clone)]
pub struct Tools(pub(crate) PluginHost);

/// The verifier registry of a [`PluginHost`].
#[derive(Debug, Clone)]
pub struct Verifiers(pub(crate) PluginHost);

impl Tools {
    /// Every loaded tool, by name then version.
    pub fn list(&self) -> Vec<Entry> {
        self.0.with_registry(|r| r.list(PluginKind::Tool))
    }
}

impl Verifiers {
    /// Every loaded verifier, by name then version.
    pub fn list(&self) -> Vec<Entry> {
        self.0.with_registry(|r| r.list(PluginKind::Verifier))
    }
}

fn unresolved(e: InvokeError, r: &ToolRef) -> Unresolved {
    match e {
        InvokeError::NotFound(u) => u,
        InvokeError::Withheld { reason, .. } => Unresolved {
            name: r.name.clone(),
            requested: r.version.to_string(),
            registry: "tools".to_owned(),
            available_versions: Vec::new(),
            nearest: Vec::new(),
            withheld: Some(reason),
        },
        other => Unresolved {
            name: r.name.clone(),
            requested: r.version.to_string(),
            registry: other.to_string(),
            available_versions: Vec::new(),
            nearest: Vec::new(),
            withheld: None,
        },
    }
}

impl ToolRegistry for Tools {
    fn resolve_tool(&self, tool: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.0
            .with_registry(|r| r.resolve(PluginKind::Tool, tool, None))
            .map(|l| ToolInfo {
                max_timeout_ms: Some(
                    u64::try_from(l.limits.timeout.as_millis()).unwrap_or(u64::MAX),
                ),
                ..l.info.clone()
            })
            .map_err(|e| unresolved(e, tool))
    }
}

impl VerifierRegistry for Verifiers {
    fn resolve_verifier(&self, verifier: &ToolRef) -> Result<ToolInfo, Unresolved> {
        self.0
            .with_registry(|r| r.resolve(PluginKind::Verifier, verifier, None))
            .map(|l| l.info.clone())
            .map_err(|e| unresolved(e, verifier))
    }
}
