//! The host: building it, loading components into its registries, and
//! invoking tools and verifiers behind the recorded hostcall boundary.
//!
//! Every call into a guest goes through [`Host::run_guest`], which builds a
//! fresh store from the invocation's grants and limits, runs the call under
//! the wall-clock timeout, and returns what the record needs; the public
//! `invoke_*` methods turn that into an outcome and a [`HostcallRecord`].
//! This module knows nothing of workflows: a call arrives with its
//! arguments and idempotency key already decided.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store, Trap, UpdateDeadline};
use workflow::{Capability, EffectClass, Ineligibility, ToolInfo, ToolRef, shadow_eligibility};

use crate::bindings::{self, Descriptor, ToolPre, VerifierPre};
pub use crate::engine::AllocatorKind;
use crate::engine::{self, CompileCache, EngineSettings};
use crate::error::{BuildError, InvokeError, LoadError, ToolError};
use crate::imports::{self, Import, ImportProblem};
use crate::limits::{
    DEFAULT_MAX_CONCURRENT, Limits, MAX_ERROR_MESSAGE_BYTES, MemoryLimitHit, STDERR_CAPTURE_BYTES,
};
use crate::policy::{Grant, Policy};
use crate::record::{
    Baseline, CallKind, Captured, HostCall, HostcallRecord, Outcome, Refusal, ToolIdentity,
    WIT_PACKAGE, b3,
};
pub use crate::registry::PluginKind;
use crate::registry::{Loaded, Pre, Registry, Tools, Verifiers};
use crate::state::{self, CallState};

/// A tool invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub tool: ToolRef,
    /// The arguments; canonicalized (RFC 8785) before the guest sees them.
    pub args: Value,
    /// The same on every retry of one logical call (the executor derives it
    /// from run, step and iteration).
    pub idempotency_key: String,
    /// The component digest (`b3:…`) the caller pinned; another registered
    /// component is refused with `DigestMismatch`.
    pub expected_digest: Option<String>,
    /// A tighter wall-clock limit than the tool's own (never a looser one).
    pub timeout: Option<Duration>,
}

impl ToolCall {
    pub fn new(tool: ToolRef, args: Value, idempotency_key: impl Into<String>) -> Self {
        ToolCall {
            tool,
            args,
            idempotency_key: idempotency_key.into(),
            expected_digest: None,
            timeout: None,
        }
    }

    /// Pins the component digest.
    pub fn pinned(mut self, digest: impl Into<String>) -> Self {
        self.expected_digest = Some(digest.into());
        self
    }

    /// Tightens the wall-clock limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// A verifier invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierCall {
    pub verifier: ToolRef,
    /// The attempt's input.
    pub input: Value,
    /// The attempt's output.
    pub output: Value,
    /// The verifier's configuration.
    pub config: Value,
    pub expected_digest: Option<String>,
    pub timeout: Option<Duration>,
}

impl VerifierCall {
    pub fn new(verifier: ToolRef, input: Value, output: Value, config: Value) -> Self {
        VerifierCall {
            verifier,
            input,
            output,
            config,
            expected_digest: None,
            timeout: None,
        }
    }
}

/// A verifier's judgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub pass: bool,
    /// In 0..=1.
    pub score: f64,
    pub reason: String,
}

/// The result of a tool invocation and its record.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub outcome: Result<Value, InvokeError>,
    pub record: HostcallRecord,
}

/// The result of a verifier invocation and its record.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifierInvocation {
    pub outcome: Result<Verdict, InvokeError>,
    pub record: HostcallRecord,
}

/// What a component says about itself and what it imports, without
/// loading it (`poimen plugin inspect`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inspection {
    pub kind: PluginKind,
    pub info: ToolInfo,
    pub imports: Vec<Import>,
    /// Imports the declared capabilities do not cover; a host refuses to
    /// load the component while any is listed.
    pub problems: Vec<String>,
    pub eligibility: Result<(), Vec<Ineligibility>>,
}

/// Builds a [`Host`].
#[derive(Default)]
#[must_use]
pub struct HostBuilder {
    cache_dir: Option<PathBuf>,
    policy: Option<Policy>,
    policy_file: Option<PathBuf>,
    plugin_dirs: Vec<PathBuf>,
    components: Vec<(String, Vec<u8>)>,
    limits: Option<Limits>,
    no_fuel: bool,
    no_pooling: bool,
    pool_instances: Option<u32>,
    max_concurrent: Option<usize>,
    withhold_ungranted: bool,
}

impl HostBuilder {
    /// At build, a component that declares a capability the policy does not
    /// grant is withheld (listed by [`Host::withheld`], and every attempt to
    /// resolve it fails with [`InvokeError::Withheld`] naming the capability
    /// and how to grant it) instead of failing the whole build. Default off:
    /// every refusal fails the build.
    pub fn withhold_ungranted(mut self, on: bool) -> Self {
        self.withhold_ungranted = on;
        self
    }

    /// Where compiled components are cached. Must be private to poimen:
    /// files in it are loaded as native code.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// The capability policy (default: grants nothing but scratch).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Reads the capability policy from a TOML file at build.
    pub fn policy_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.policy_file = Some(path.into());
        self
    }

    /// Loads every `*.wasm` in this directory at build.
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dirs.push(dir.into());
        self
    }

    /// Loads this component at build; `origin` names it in errors (e.g.
    /// `bundled:json`).
    pub fn component_bytes(mut self, origin: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        self.components.push((origin.into(), bytes.into()));
        self
    }

    /// Default limits, before policy overrides.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Whether to meter fuel (default on). Off makes calls a little faster
    /// and records no fuel.
    pub fn fuel(mut self, on: bool) -> Self {
        self.no_fuel = !on;
        self
    }

    /// Whether to use the pooling allocator (default on; falls back to
    /// on-demand when the pool cannot be reserved).
    pub fn pooling(mut self, on: bool) -> Self {
        self.no_pooling = !on;
        self
    }

    /// How many component instances the pool holds (default: twice the
    /// concurrency limit).
    pub fn pool_instances(mut self, n: u32) -> Self {
        self.pool_instances = Some(n);
        self
    }

    /// How many invocations run at once; more wait.
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = Some(n.max(1));
        self
    }

    /// Builds the engine, reads the policy, loads every component. Fails if
    /// any component is refused, listing every refusal.
    pub async fn build(self) -> Result<Host, BuildError> {
        let policy = match (self.policy, &self.policy_file) {
            (_, Some(path)) => Policy::from_file(path)?,
            (Some(p), None) => p,
            (None, None) => Policy::new(),
        };
        let max_concurrent = self.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT);
        let pool_instances = self
            .pool_instances
            .unwrap_or_else(|| u32::try_from(max_concurrent.saturating_mul(2)).unwrap_or(u32::MAX));
        let mut base_limits = self.limits.unwrap_or_default();
        if self.no_fuel {
            base_limits.fuel = None;
        } else if base_limits.fuel.is_none() {
            base_limits.fuel = Limits::default().fuel;
        }
        let (engine, allocator) = engine::build(EngineSettings {
            fuel: !self.no_fuel,
            pooling: !self.no_pooling,
            pool_instances,
        })
        .map_err(BuildError::Engine)?;
        let cache = CompileCache::new(self.cache_dir.clone(), &engine).map_err(|message| {
            BuildError::Cache {
                path: self
                    .cache_dir
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                message,
            }
        })?;
        let mut linker = Linker::new(&engine);
        state::link(&mut linker).map_err(|e| BuildError::Engine(format!("{e:#}")))?;
        engine::start_ticker(&engine);

        let mut components = Vec::new();
        let mut sources = Vec::new();
        for dir in &self.plugin_dirs {
            components.extend(read_plugin_dir(dir)?);
            sources.push(dir.display().to_string());
        }
        if !self.components.is_empty() {
            sources.insert(0, "components given by the embedder".to_owned());
        }
        let host = Host {
            inner: Arc::new(Inner {
                engine,
                allocator,
                linker,
                cache,
                policy,
                base_limits,
                registry: RwLock::new(Registry::new(sources)),
                slots: tokio::sync::Semaphore::new(max_concurrent),
                in_flight: AtomicUsize::new(0),
            }),
        };
        let mut refused = Vec::new();
        for (origin, bytes) in self.components.into_iter().chain(components) {
            if let Err(e) = host
                .load_inner(origin, bytes, self.withhold_ungranted)
                .await
            {
                // A withheld component is recorded, not refused.
                let withheld =
                    self.withhold_ungranted && matches!(e, LoadError::CapabilityDenied { .. });
                if !withheld {
                    refused.push(e);
                }
            }
        }
        if refused.is_empty() {
            Ok(host)
        } else {
            Err(BuildError::Refused(refused))
        }
    }
}

impl std::fmt::Debug for HostBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The component bytes are megabytes: show where they came from.
        let components: Vec<(&str, usize)> = self
            .components
            .iter()
            .map(|(o, b)| (o.as_str(), b.len()))
            .collect();
        f.debug_struct("HostBuilder")
            .field("cache_dir", &self.cache_dir)
            .field("policy", &self.policy)
            .field("policy_file", &self.policy_file)
            .field("plugin_dirs", &self.plugin_dirs)
            .field("components", &components)
            .field("limits", &self.limits)
            .field("fuel", &!self.no_fuel)
            .field("pooling", &!self.no_pooling)
            .field("pool_instances", &self.pool_instances)
            .field("max_concurrent", &self.max_concurrent)
            .field("withhold_ungranted", &self.withhold_ungranted)
            .finish()
    }
}

fn read_plugin_dir(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, BuildError> {
    let err = |e: std::io::Error| BuildError::PluginDir {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm") && p.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            std::fs::read(&p)
                .map(|b| (p.display().to_string(), b))
                .map_err(err)
        })
        .collect()
}

/// The plugin host. Cheap to clone; `Send + Sync`; every invocation runs in
/// its own store, so any number can run at once (up to the concurrency
/// limit, beyond which they wait).
#[derive(Clone)]
pub struct Host {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    allocator: AllocatorKind,
    linker: Linker<CallState>,
    cache: CompileCache,
    policy: Policy,
    base_limits: Limits,
    registry: RwLock<Registry>,
    slots: tokio::sync::Semaphore,
    in_flight: AtomicUsize,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("allocator", &self.inner.allocator)
            .field("policy", self.inner.policy.source())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

/// What a guest call is.
enum GuestCall<'a> {
    Describe,
    Invoke {
        args: &'a str,
        key: &'a str,
    },
    Verify {
        input: &'a str,
        output: &'a str,
        config: &'a str,
    },
}

/// What a guest call returned.
enum Returned {
    Described(Descriptor),
    Invoked(Result<String, bindings::ToolError>),
    Verified(Result<bindings::Verdict, bindings::ToolError>),
}

/// Everything one guest run leaves for the record.
struct GuestRun {
    result: Result<Returned, InvokeError>,
    fuel_consumed: Option<u64>,
    host_calls: Vec<HostCall>,
    refusals: Vec<Refusal>,
    baseline: Baseline,
    stderr: Captured,
}

/// Decrements the in-flight count when an invocation ends or is dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The panic message in a Rust guest's stderr, if it panicked.
fn panic_message(stderr: &str) -> Option<String> {
    let start = stderr.find("panicked at ")?;
    let after = &stderr[start..];
    let body = after.split_once('\n').map_or("", |(_, rest)| rest);
    let message: Vec<&str> = body
        .lines()
        .take_while(|l| !l.starts_with("note: "))
        .collect();
    Some(message.join("\n").trim().to_owned())
}

/// Turns a wasmtime error from a guest call into the specific error.
fn classify(err: &wasmtime::Error, limits: &Limits, stderr: &Captured) -> InvokeError {
    if let Some(hit) = err.downcast_ref::<MemoryLimitHit>() {
        return InvokeError::MemoryExhausted {
            limit_bytes: hit.limit,
            requested_bytes: hit.requested,
        };
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        return match trap {
            Trap::StackOverflow => InvokeError::StackOverflow,
            Trap::OutOfFuel => InvokeError::FuelExhausted {
                limit: limits.fuel.unwrap_or(0),
            },
            Trap::Interrupt => InvokeError::Timeout {
                limit: limits.timeout,
            },
            Trap::UnreachableCodeReached => match panic_message(&stderr.text) {
                Some(message) => InvokeError::GuestPanicked {
                    message,
                    stderr: stderr.text.clone(),
                },
                None => InvokeError::Trap {
                    trap: trap.to_string(),
                    stderr: stderr.text.clone(),
                },
            },
            t => InvokeError::Trap {
                trap: t.to_string(),
                stderr: stderr.text.clone(),
            },
        };
    }
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return InvokeError::Trap {
            trap: format!("the guest called exit({})", exit.0),
            stderr: stderr.text.clone(),
        };
    }
    InvokeError::Trap {
        trap: format!("{err:#}"),
        stderr: stderr.text.clone(),
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn tool_error(e: bindings::ToolError) -> ToolError {
    match e {
        bindings::ToolError::InvalidInput(m) => {
            ToolError::InvalidInput(truncate(m, MAX_ERROR_MESSAGE_BYTES))
        }
        bindings::ToolError::Failed(m) => ToolError::Failed(truncate(m, MAX_ERROR_MESSAGE_BYTES)),
        bindings::ToolError::Unavailable(m) => {
            ToolError::Unavailable(truncate(m, MAX_ERROR_MESSAGE_BYTES))
        }
    }
}

fn canonical(v: &Value) -> Result<String, InvokeError> {
    crate::canonical::to_string(v)
        .map_err(|e| InvokeError::Host(format!("cannot canonicalize JSON: {e}")))
}

/// What a successful outcome hashes as: its canonical JSON text.
trait CanonicalText {
    fn canonical_text(&self) -> String;
}

impl CanonicalText for Value {
    fn canonical_text(&self) -> String {
        crate::canonical::to_string(self).unwrap_or_default()
    }
}

impl CanonicalText for Verdict {
    fn canonical_text(&self) -> String {
        serde_json::to_value(self)
            .map(|v| v.canonical_text())
            .unwrap_or_default()
    }
}

/// A registry name: lowercase letters, digits and `-`, starting with a
/// letter or digit.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

fn descriptor_info(origin: &str, d: Descriptor, digest: &str) -> Result<ToolInfo, LoadError> {
    let bad = |field: &'static str, message: String| LoadError::BadDescriptor {
        origin: origin.to_owned(),
        field,
        message,
    };
    if !valid_name(&d.name) {
        return Err(bad(
            "name",
            format!("`{}` is not lowercase letters, digits and `-`", d.name),
        ));
    }
    let version = semver::Version::parse(&d.version)
        .map_err(|e| bad("version", format!("`{}`: {e}", d.version)))?;
    let schema = |field: &'static str, text: &str| -> Result<Value, LoadError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| bad(field, format!("not JSON: {e}")))?;
        if v.is_object() || v.is_boolean() {
            Ok(v)
        } else {
            Err(bad(field, "a JSON Schema is an object or a boolean".into()))
        }
    };
    let capabilities = d
        .capabilities
        .iter()
        .map(|c| {
            c.parse::<Capability>()
                .map_err(|e| bad("capabilities", e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ToolInfo {
        name: d.name,
        version,
        digest: digest.to_owned(),
        description: d.description,
        input_schema: schema("input-schema", &d.input_schema)?,
        output_schema: schema("output-schema", &d.output_schema)?,
        capabilities,
        effect: match d.effect {
            bindings::EffectClass::Pure => EffectClass::Pure,
            bindings::EffectClass::Idempotent => EffectClass::Idempotent,
            bindings::EffectClass::NonIdempotent => EffectClass::NonIdempotent,
        },
    })
}

/// A component compiled and checked up to (not including) policy.
struct Checked {
    kind: PluginKind,
    info: ToolInfo,
    pre: Pre,
    imports: Vec<Import>,
    /// Imports the declared capabilities do not cover, and what would.
    undeclared: Vec<(String, &'static str)>,
    cache: engine::CacheOutcome,
    describe_record: HostcallRecord,
}

impl Host {
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

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

    pub(crate) fn with_registry<R>(&self, f: impl FnOnce(&Registry) -> R) -> R {
        f(&self
            .inner
            .registry
            .read()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Compiles (or reads from the cache), checks imports, calls `describe`.
    async fn check(&self, origin: &str, bytes: Vec<u8>) -> Result<Checked, LoadError> {
        let digest_hex = blake3::hash(&bytes).to_hex().to_string();
        let digest = format!("b3:{digest_hex}");
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let compiled =
            tokio::task::spawn_blocking(move || cache.load(&engine, &bytes, &digest_hex)).await;
        let (component, cache) = match compiled {
            Ok(r) => r.map_err(|message| LoadError::Compile {
                origin: origin.to_owned(),
                message,
            })?,
            Err(e) => {
                return Err(LoadError::Compile {
                    origin: origin.to_owned(),
                    message: e.to_string(),
                });
            }
        };
        let imports = imports::of_component(&component, &self.inner.engine);
        if let Some(p) = imports::never_loadable(&imports).into_iter().next() {
            return Err(match p {
                ImportProblem::Sockets { import } => LoadError::Sockets {
                    origin: origin.to_owned(),
                    import,
                },
                ImportProblem::Unknown { import } | ImportProblem::Undeclared { import, .. } => {
                    LoadError::UnknownImport {
                        origin: origin.to_owned(),
                        import,
                    }
                }
            });
        }
        let (kind, pre) = self.prelink(origin, &component)?;
        let limits = self.inner.policy.limits_for("", self.inner.base_limits);
        let started = Instant::now();
        let mut record = HostcallRecord {
            kind: CallKind::Describe,
            requested: origin.to_owned(),
            tool: None,
            args: "null".to_owned(),
            args_hash: b3(b"null"),
            idempotency_key: None,
            capabilities: Vec::new(),
            limits,
            host_calls: Vec::new(),
            refusals: Vec::new(),
            baseline: Baseline::default(),
            outcome: Outcome::Error {
                kind: String::new(),
                message: String::new(),
            },
            fuel_consumed: None,
            wall_time_us: 0,
            stderr: Captured::default(),
        };
        let run = self
            .run_guest(
                &pre,
                &[],
                limits,
                &state::seed(&digest, &record.args_hash),
                GuestCall::Describe,
            )
            .await;
        let result = self.fill(&mut record, run, origin, started);
        let descriptor = match result {
            Ok(Returned::Described(d)) => d,
            Ok(_) => {
                return Err(LoadError::Describe {
                    origin: origin.to_owned(),
                    error: Box::new(InvokeError::Host("unexpected return".into())),
                });
            }
            Err(error) => {
                record.outcome = Outcome::Error {
                    kind: error.kind().to_owned(),
                    message: error.to_string(),
                };
                return Err(LoadError::Describe {
                    origin: origin.to_owned(),
                    error: Box::new(error),
                });
            }
        };
        let info = descriptor_info(origin, descriptor, &digest)?;
        record.tool = Some(ToolIdentity {
            name: info.name.clone(),
            version: info.version.to_string(),
            digest: digest.clone(),
            wit_package: WIT_PACKAGE.to_owned(),
        });
        let described = serde_json::to_value(&info).unwrap_or(Value::Null);
        let text = canonical(&described).unwrap_or_default();
        record.outcome = Outcome::Ok {
            output_hash: b3(text.as_bytes()),
            output_bytes: text.len() as u64,
        };
        let undeclared = imports::check(&imports, &info.capabilities)
            .into_iter()
            .filter_map(|p| match p {
                ImportProblem::Undeclared { import, needs } => Some((import, needs)),
                _ => None,
            })
            .collect();
        Ok(Checked {
            kind,
            info,
            pre,
            imports,
            undeclared,
            cache,
            describe_record: record,
        })
    }

    fn prelink(&self, origin: &str, component: &Component) -> Result<(PluginKind, Pre), LoadError> {
        let engine = &self.inner.engine;
        let ty = component.component_type();
        let exports: Vec<&str> = ty.exports(engine).map(|(n, _)| n).collect();
        let kind = match (exports.contains(&"invoke"), exports.contains(&"verify")) {
            (true, false) => PluginKind::Tool,
            (false, true) => PluginKind::Verifier,
            _ => {
                return Err(LoadError::NotAPlugin {
                    origin: origin.to_owned(),
                    reason: format!(
                        "it exports {exports:?}; a tool exports `describe` and `invoke`, a verifier `describe` and `verify`"
                    ),
                });
            }
        };
        let pre = self
            .inner
            .linker
            .instantiate_pre(component)
            .map_err(|e| LoadError::Compile {
                origin: origin.to_owned(),
                message: format!("cannot link: {e:#}"),
            })?;
        let not_a_plugin = |e: wasmtime::Error| LoadError::NotAPlugin {
            origin: origin.to_owned(),
            reason: format!("{e:#}"),
        };
        let pre = match kind {
            PluginKind::Tool => Pre::Tool(ToolPre::new(pre).map_err(not_a_plugin)?),
            PluginKind::Verifier => Pre::Verifier(VerifierPre::new(pre).map_err(not_a_plugin)?),
        };
        Ok((kind, pre))
    }

    /// Loads one component into the registries: compiles it (or reads the
    /// cache), checks its imports against its declared capabilities and
    /// those against policy, and registers it.
    pub async fn load_component(
        &self,
        origin: impl Into<String>,
        bytes: impl Into<Vec<u8>>,
    ) -> Result<crate::registry::Entry, LoadError> {
        self.load_inner(origin.into(), bytes.into(), false).await
    }

    /// Components withheld at build for want of a grant (see
    /// [`HostBuilder::withhold_ungranted`]).
    pub fn withheld(&self) -> Vec<crate::registry::WithheldEntry> {
        self.with_registry(|r| r.withheld())
    }

    /// Loads a component. With `withhold`, one denied a capability is also
    /// recorded as withheld; the denial is returned either way.
    async fn load_inner(
        &self,
        origin: String,
        bytes: Vec<u8>,
        withhold: bool,
    ) -> Result<crate::registry::Entry, LoadError> {
        let c = self.check(&origin, bytes).await?;
        if let Some((import, needs)) = c.undeclared.first() {
            return Err(LoadError::UndeclaredImport {
                component: c.info.name,
                origin,
                import: import.clone(),
                needs,
            });
        }
        let policy = &self.inner.policy;
        let grants = match policy.grant(&c.info.name, &c.info.capabilities) {
            Ok(grants) => grants,
            Err(missing) => {
                let denied = match missing.first() {
                    Some(first) => LoadError::CapabilityDenied {
                        component: c.info.name.clone(),
                        origin: origin.clone(),
                        capability: first.capability.to_string(),
                        policy: policy.source().to_string(),
                        hint: first.hint.clone(),
                    },
                    None => LoadError::CapabilityDenied {
                        component: c.info.name.clone(),
                        origin: origin.clone(),
                        capability: "(unnamed)".to_owned(),
                        policy: policy.source().to_string(),
                        hint: String::new(),
                    },
                };
                if !withhold {
                    return Err(denied);
                }
                let entry = crate::registry::WithheldEntry {
                    info: c.info,
                    kind: c.kind,
                    origin,
                    reason: denied.to_string(),
                };
                self.inner
                    .registry
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .withhold(entry);
                return Err(denied);
            }
        };
        let limits = policy.limits_for(&c.info.name, self.inner.base_limits);
        let identity = ToolIdentity {
            name: c.info.name.clone(),
            version: c.info.version.to_string(),
            digest: c.info.digest.clone(),
            wit_package: WIT_PACKAGE.to_owned(),
        };
        let loaded = Loaded {
            info: c.info,
            kind: c.kind,
            origin,
            identity,
            pre: c.pre,
            imports: c.imports,
            grants,
            limits,
            cache: c.cache,
            describe_record: c.describe_record,
        };
        let mut registry = self
            .inner
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        registry.insert(loaded).map(|l| l.entry())
    }

    /// Describes a component and lists its imports without registering it.
    pub async fn inspect(&self, bytes: impl Into<Vec<u8>>) -> Result<Inspection, LoadError> {
        let c = self.check("inspected component", bytes.into()).await?;
        Ok(Inspection {
            kind: c.kind,
            eligibility: shadow_eligibility(&c.info.capabilities, c.info.effect),
            problems: c
                .undeclared
                .into_iter()
                .map(|(import, needs)| format!("imports `{import}` without declaring {needs}"))
                .collect(),
            info: c.info,
            imports: c.imports,
        })
    }

    /// Runs one guest call in a fresh store under `limits`.
    async fn run_guest(
        &self,
        pre: &Pre,
        grants: &[Grant],
        limits: Limits,
        seed: &[u8; 32],
        call: GuestCall<'_>,
    ) -> GuestRun {
        let failed = |e: InvokeError| GuestRun {
            result: Err(e),
            fuel_consumed: None,
            host_calls: Vec::new(),
            refusals: Vec::new(),
            baseline: Baseline::default(),
            stderr: Captured::default(),
        };
        let Ok(_permit) = self.inner.slots.acquire().await else {
            return failed(InvokeError::Host("the host is shutting down".into()));
        };
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.inner.in_flight);
        let state = match CallState::new(grants, seed, limits.memory_bytes, STDERR_CAPTURE_BYTES) {
            Ok(s) => s,
            Err(m) => return failed(InvokeError::Host(m)),
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        if let Some(fuel) = limits.fuel
            && let Err(e) = store.set_fuel(fuel)
        {
            return failed(InvokeError::Host(format!("cannot set fuel: {e:#}")));
        }
        // Every tick, yield to the executor: the timeout's timer can fire
        // and a dropped future stops the guest.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));

        let run = async {
            match (pre, call) {
                (Pre::Tool(p), GuestCall::Describe) => {
                    let i = p
                        .instantiate_async(&mut store)
                        .await
                        .map_err(|e| (true, e))?;
                    i.call_describe(&mut store)
                        .await
                        .map(Returned::Described)
                        .map_err(|e| (false, e))
                }
                (Pre::Tool(p), GuestCall::Invoke { args, key }) => {
                    let i = p
                        .instantiate_async(&mut store)
                        .await
                        .map_err(|e| (true, e))?;
                    i.call_invoke(&mut store, args, key)
                        .await
                        .map(Returned::Invoked)
                        .map_err(|e| (false, e))
                }
                (Pre::Verifier(p), GuestCall::Describe) => {
                    let i = p
                        .instantiate_async(&mut store)
                        .await
                        .map_err(|e| (true, e))?;
                    i.call_describe(&mut store)
                        .await
                        .map(Returned::Described)
                        .map_err(|e| (false, e))
                }
                (
                    Pre::Verifier(p),
                    GuestCall::Verify {
                        input,
                        output,
                        config,
                    },
                ) => {
                    let i = p
                        .instantiate_async(&mut store)
                        .await
                        .map_err(|e| (true, e))?;
                    i.call_verify(&mut store, input, output, config)
                        .await
                        .map(Returned::Verified)
                        .map_err(|e| (false, e))
                }
                _ => Err((
                    true,
                    wasmtime::Error::msg("this component does not export that function"),
                )),
            }
        };
        let timed = tokio::time::timeout(limits.timeout, run).await;

        let fuel_consumed = limits
            .fuel
            .map(|f| f.saturating_sub(store.get_fuel().unwrap_or(f)));
        let data = store.data();
        let stderr = data.stderr();
        let baseline = data.baseline();
        let (host_calls, refusals) = data.journal.take();
        let result = match timed {
            Err(_) => Err(InvokeError::Timeout {
                limit: limits.timeout,
            }),
            Ok(Ok(r)) => Ok(r),
            Ok(Err((instantiating, e))) => Err(match classify(&e, &limits, &stderr) {
                InvokeError::Trap { trap, .. } if instantiating => {
                    InvokeError::Host(format!("cannot instantiate: {trap}"))
                }
                other => other,
            }),
        };
        GuestRun {
            result,
            fuel_consumed,
            host_calls,
            refusals,
            baseline,
            stderr,
        }
    }

    /// Copies a run's observations into `record` and returns its result,
    /// turned into `CapabilityDenied` if the guest was refused anything.
    fn fill(
        &self,
        record: &mut HostcallRecord,
        run: GuestRun,
        component: &str,
        started: Instant,
    ) -> Result<Returned, InvokeError> {
        record.fuel_consumed = run.fuel_consumed;
        record.host_calls = run.host_calls;
        record.baseline = run.baseline;
        record.stderr = run.stderr;
        record.wall_time_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let refused = run.refusals.first().cloned();
        record.refusals = run.refusals;
        match refused {
            Some(r) => Err(InvokeError::CapabilityDenied {
                component: component.to_owned(),
                capability: r.capability,
                attempted: r.attempted,
                why: r.why,
                policy: self.inner.policy.source().to_string(),
            }),
            None => run.result,
        }
    }

    fn resolve(
        &self,
        kind: PluginKind,
        r: &ToolRef,
        digest: Option<&str>,
    ) -> Result<Arc<Loaded>, InvokeError> {
        self.with_registry(|reg| reg.resolve(kind, r, digest))
    }

    fn record(
        kind: CallKind,
        requested: String,
        args: String,
        key: Option<String>,
        limits: Limits,
    ) -> HostcallRecord {
        HostcallRecord {
            kind,
            requested,
            tool: None,
            args_hash: b3(args.as_bytes()),
            args,
            idempotency_key: key,
            capabilities: Vec::new(),
            limits,
            host_calls: Vec::new(),
            refusals: Vec::new(),
            baseline: Baseline::default(),
            outcome: Outcome::Error {
                kind: String::new(),
                message: String::new(),
            },
            fuel_consumed: None,
            wall_time_us: 0,
            stderr: Captured::default(),
        }
    }

    fn effective_limits(entry: &Loaded, timeout: Option<Duration>) -> Limits {
        let mut limits = entry.limits;
        if let Some(t) = timeout {
            limits.timeout = limits.timeout.min(t);
        }
        limits
    }

    /// Invokes a tool. Never fails outright: the outcome is in the result,
    /// and there is a record either way.
    pub async fn invoke_tool(&self, call: ToolCall) -> Invocation {
        let started = Instant::now();
        let args = canonical(&call.args);
        let mut record = Self::record(
            CallKind::Tool,
            call.tool.to_string(),
            args.as_ref().map_or_else(|_| String::new(), Clone::clone),
            Some(call.idempotency_key.clone()),
            self.inner.base_limits,
        );
        let outcome = async {
            args?;
            let entry = self.resolve(
                PluginKind::Tool,
                &call.tool,
                call.expected_digest.as_deref(),
            )?;
            record.tool = Some(entry.identity.clone());
            record.capabilities = entry.grants.clone();
            let limits = Self::effective_limits(&entry, call.timeout);
            record.limits = limits;
            let seed = state::seed(&call.idempotency_key, &record.args_hash);
            let run = self
                .run_guest(
                    &entry.pre,
                    &entry.grants,
                    limits,
                    &seed,
                    GuestCall::Invoke {
                        args: &record.args,
                        key: &call.idempotency_key,
                    },
                )
                .await;
            match self.fill(&mut record, run, &entry.info.name, started)? {
                Returned::Invoked(Ok(text)) => {
                    if text.len() as u64 > limits.output_bytes {
                        return Err(InvokeError::OutputTooLarge {
                            bytes: text.len() as u64,
                            limit_bytes: limits.output_bytes,
                        });
                    }
                    serde_json::from_str::<Value>(&text).map_err(|e| {
                        InvokeError::InvalidOutput(format!("the result is not JSON: {e}"))
                    })
                }
                Returned::Invoked(Err(e)) => Err(InvokeError::Tool(tool_error(e))),
                _ => Err(InvokeError::Host("unexpected return".into())),
            }
        }
        .await;
        Self::finish(&mut record, &outcome, started);
        Invocation { outcome, record }
    }

    /// Invokes a verifier. As [`invoke_tool`](Self::invoke_tool), the
    /// record is there whatever happens.
    pub async fn invoke_verifier(&self, call: VerifierCall) -> VerifierInvocation {
        let started = Instant::now();
        let parts = (
            canonical(&call.input),
            canonical(&call.output),
            canonical(&call.config),
        );
        let args = canonical(
            &serde_json::json!({"config": call.config, "input": call.input, "output": call.output}),
        );
        let mut record = Self::record(
            CallKind::Verifier,
            call.verifier.to_string(),
            args.as_ref().map_or_else(|_| String::new(), Clone::clone),
            None,
            self.inner.base_limits,
        );
        let outcome = async {
            args?;
            let (input, output, config) = (parts.0?, parts.1?, parts.2?);
            let entry = self.resolve(
                PluginKind::Verifier,
                &call.verifier,
                call.expected_digest.as_deref(),
            )?;
            record.tool = Some(entry.identity.clone());
            record.capabilities = entry.grants.clone();
            let limits = Self::effective_limits(&entry, call.timeout);
            record.limits = limits;
            let seed = state::seed("", &record.args_hash);
            let run = self
                .run_guest(
                    &entry.pre,
                    &entry.grants,
                    limits,
                    &seed,
                    GuestCall::Verify {
                        input: &input,
                        output: &output,
                        config: &config,
                    },
                )
                .await;
            match self.fill(&mut record, run, &entry.info.name, started)? {
                Returned::Verified(Ok(v)) => {
                    if v.reason.len() as u64 > limits.output_bytes {
                        return Err(InvokeError::OutputTooLarge {
                            bytes: v.reason.len() as u64,
                            limit_bytes: limits.output_bytes,
                        });
                    }
                    if !(0.0..=1.0).contains(&v.score) {
                        return Err(InvokeError::InvalidOutput(format!(
                            "score {} is outside 0..=1",
                            v.score
                        )));
                    }
                    Ok(Verdict {
                        pass: v.pass,
                        score: v.score,
                        reason: v.reason,
                    })
                }
                Returned::Verified(Err(e)) => Err(InvokeError::Tool(tool_error(e))),
                _ => Err(InvokeError::Host("unexpected return".into())),
            }
        }
        .await;
        Self::finish(&mut record, &outcome, started);
        VerifierInvocation { outcome, record }
    }

    fn finish<T: CanonicalText>(
        record: &mut HostcallRecord,
        outcome: &Result<T, InvokeError>,
        started: Instant,
    ) {
        record.outcome = match outcome {
            Ok(v) => {
                let text = v.canonical_text();
                Outcome::Ok {
                    output_hash: b3(text.as_bytes()),
                    output_bytes: text.len() as u64,
                }
            }
            Err(e) => Outcome::Error {
                kind: e.kind().to_owned(),
                message: e.to_string(),
            },
        };
        record.wall_time_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    }
}

/// Describes a component and lists its imports, on a throwaway host that
/// grants nothing (for `poimen plugin inspect`).
pub async fn inspect(bytes: impl Into<Vec<u8>>) -> Result<Inspection, LoadError> {
    let host = Host::builder()
        .pooling(false)
        .build()
        .await
        .map_err(|e| LoadError::Compile {
            origin: "inspected component".into(),
            message: e.to_string(),
        })?;
    host.inspect(bytes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_come_out_of_rust_stderr() {
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:20:9:\nadversarial panic on {}\nsecond line\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            panic_message(stderr).as_deref(),
            Some("adversarial panic on {}\nsecond line")
        );
        assert_eq!(panic_message("just an error\n"), None);
    }

    #[test]
    fn names_and_truncation() {
        assert!(valid_name("fs-read"));
        assert!(valid_name("adv-2"));
        assert!(!valid_name("Fs"));
        assert!(!valid_name("-x"));
        assert!(!valid_name(""));
        assert_eq!(truncate("héllo".into(), 2), "h…");
        assert_eq!(truncate("abc".into(), 5), "abc");
    }
}
