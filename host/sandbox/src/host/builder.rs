//! Building a [`PluginHost`]: the engine, the policy, the compile cache,
//! and every component it starts with.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};

use wasmtime::component::Linker;

use super::{Inner, PluginHost};
use crate::engine::{self, CompileCache, EngineSettings};
use crate::error::{BuildError, LoadError};
use crate::limits::{CallLimits, DEFAULT_MAX_CONCURRENT};
use crate::policy::Policy;
use crate::registry::Registry;
use crate::state;

impl PluginHost {
    pub fn builder() -> PluginHostBuilder {
        PluginHostBuilder::default()
    }
}

/// Builds a [`PluginHost`].
#[derive(Default)]
#[must_use]
pub struct PluginHostBuilder {
    cache_dir: Option<PathBuf>,
    cache_max_bytes: Option<u64>,
    policy: Option<Policy>,
    policy_file: Option<PathBuf>,
    plugin_dirs: Vec<PathBuf>,
    components: Vec<(String, Cow<'static, [u8]>)>,
    limits: Option<CallLimits>,
    no_fuel: bool,
    no_pooling: bool,
    pool_instances: Option<u32>,
    max_concurrent: Option<usize>,
    withhold_ungranted: bool,
    scratch_dir: Option<PathBuf>,
}

impl PluginHostBuilder {
    /// At build, a component that declares a capability the policy does not
    /// grant is withheld (listed by [`PluginHost::withheld`], and every attempt to
    /// resolve it fails with [`InvokeError::Withheld`] naming the capability
    /// and how to grant it) instead of failing the whole build; and a
    /// component from a plugin directory that cannot be loaded at all (not
    /// a component, an undeclared import, a name reserved by a component
    /// given with [`component_bytes`](Self::component_bytes), a second
    /// component under a registered name and version) is refused alone,
    /// listed by [`PluginHost::refused`] with its reason. Default off:
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

    /// How many bytes of compiled components the cache keeps (default
    /// [`DEFAULT_CACHE_MAX_BYTES`](crate::engine::DEFAULT_CACHE_MAX_BYTES));
    /// the least recently used go first.
    pub fn cache_max_bytes(mut self, bytes: u64) -> Self {
        self.cache_max_bytes = Some(bytes);
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
    /// `bundled:json`). Bytes of the program itself (`&'static [u8]`, e.g.
    /// embedded with `include_bytes!`) are used where they are, not copied.
    pub fn component_bytes(
        mut self,
        origin: impl Into<String>,
        bytes: impl Into<Cow<'static, [u8]>>,
    ) -> Self {
        self.components.push((origin.into(), bytes.into()));
        self
    }

    /// Where calls' `scratch` directories are made (default
    /// `$TMPDIR/poimen-scratch-UID`). Each host keeps its own directory there,
    /// locked while it lives; a host that starts deletes those of hosts
    /// that died.
    pub fn scratch_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch_dir = Some(dir.into());
        self
    }

    /// Default limits, before policy overrides.
    pub fn limits(mut self, limits: CallLimits) -> Self {
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
    pub async fn build(self) -> Result<PluginHost, BuildError> {
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
            base_limits.fuel = CallLimits::default().fuel;
        }
        let (engine, allocator) = engine::build(EngineSettings {
            fuel: !self.no_fuel,
            pooling: !self.no_pooling,
            pool_instances,
        })
        .map_err(BuildError::Engine)?;
        let cache = CompileCache::new(
            self.cache_dir.clone(),
            &engine,
            self.cache_max_bytes
                .unwrap_or(crate::engine::DEFAULT_CACHE_MAX_BYTES),
        )
        .map_err(|message| BuildError::Cache {
            path: self
                .cache_dir
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            message,
        })?;
        let scratch = scratch(
            self.scratch_dir
                .clone()
                .unwrap_or_else(crate::scratch::default_base),
        )
        .await?;
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
        let host = PluginHost {
            inner: Arc::new(Inner {
                engine,
                allocator,
                linker,
                cache,
                policy,
                base_limits,
                registry: RwLock::new(Registry::new(sources)),
                scratch,
                slots: tokio::sync::Semaphore::new(max_concurrent),
                in_flight: AtomicUsize::new(0),
                compiles: AtomicUsize::new(0),
                released: tokio::sync::Notify::new(),
            }),
        };
        let mut refused = Vec::new();
        // Every component is prepared at once (hashed, read from the
        // compile cache or compiled, checked, described: nothing that
        // touches the registry), each on its own task; then registered in
        // order.
        let withhold = self.withhold_ungranted;
        let prepare = |origin: String, bytes: Cow<'static, [u8]>| {
            let h = host.clone();
            let named = origin.clone();
            let task = tokio::spawn(async move {
                let prepared = h.prepare(&origin, bytes, withhold).await;
                (origin, prepared)
            });
            async move {
                task.await.map_err(|e| LoadError::Compile {
                    origin: named,
                    message: format!("loading it stopped: {e}"),
                })
            }
        };
        let given: Vec<_> = self
            .components
            .into_iter()
            .map(|(origin, bytes)| prepare(origin, bytes))
            .collect();
        let found: Vec<_> = components
            .into_iter()
            .map(|(origin, bytes)| prepare(origin, Cow::Owned(bytes)))
            .collect();
        // The embedder's components first: their names are reserved, so no
        // component from a plugin directory can take one (and be served
        // under a first-party name, with its grants).
        for prepared in given {
            let (origin, prepared) = match prepared.await {
                Ok(p) => p,
                Err(e) => {
                    refused.push(e);
                    continue;
                }
            };
            match host.register(origin, prepared, withhold, false).await {
                Ok((entry, _)) => host.reserve(&entry.info.name, &entry.origin),
                // A withheld component is recorded, not refused; its name
                // stays reserved (no one else may take it while it waits
                // for a grant).
                Err(LoadError::CapabilityDenied {
                    component, origin, ..
                }) if withhold => host.reserve(&component, &origin),
                Err(e) => refused.push(e),
            }
        }
        for prepared in found {
            let registered = match prepared.await {
                Ok((origin, prepared)) => host.register(origin, prepared, withhold, false).await,
                Err(e) => Err(e),
            };
            if let Err(e) = registered {
                if !withhold {
                    refused.push(e);
                } else if !matches!(e, LoadError::CapabilityDenied { .. }) {
                    // Tolerant: one bad file in a plugin directory never
                    // stops the host; it is listed with its reason.
                    host.refuse(crate::registry::RefusedEntry {
                        origin: e.origin().to_owned(),
                        reason: e.to_string(),
                    });
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

impl std::fmt::Debug for PluginHostBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The component bytes are megabytes: show where they came from.
        let components: Vec<(&str, usize)> = self
            .components
            .iter()
            .map(|(o, b)| (o.as_str(), b.len()))
            .collect();
        f.debug_struct("PluginHostBuilder")
            .field("cache_dir", &self.cache_dir)
            .field("cache_max_bytes", &self.cache_max_bytes)
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
            .field("scratch_dir", &self.scratch_dir)
            .finish()
    }
}

/// Sweeps `base` of dead hosts' scratch directories (a failure is only
/// worth a warning: the next start tries again), then makes this host's.
async fn scratch(base: PathBuf) -> Result<crate::scratch::ScratchRoot, BuildError> {
    let made = tokio::task::spawn_blocking(move || {
        if let Err(e) = crate::scratch::sweep(&base) {
            tracing::warn!(
                "could not sweep dead hosts' scratch directories under {}: {e}",
                base.display()
            );
        }
        crate::scratch::ScratchRoot::create(&base)
    })
    .await
    .map_err(|e| BuildError::Scratch {
        path: String::new(),
        message: e.to_string(),
    })?;
    made.map_err(|e| BuildError::Scratch {
        path: e.path.display().to_string(),
        message: e.message,
    })
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
