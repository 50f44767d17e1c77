//! The one wasmtime `Engine`, its epoch ticker, and the on-disk compile
//! cache.
//!
//! The engine runs components asynchronously with epoch interruption and
//! (optionally) fuel, and allocates instances from a pool, falling back to
//! on-demand allocation when the pool cannot reserve its address space.
//! The compile cache keys a compiled component by the Blake3 digest of its
//! bytes and the engine's compatibility hash. This module knows nothing of
//! plugins, policy or records.

use serde::{Deserialize, Serialize};
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::limits::{EPOCH_TICK, MAX_TABLE_ELEMENTS, MAX_WASM_STACK_BYTES};

/// How instances are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorKind {
    /// From a pool reserved up front (fast instantiation).
    Pooling,
    /// On demand, per instantiation.
    OnDemand,
}

/// Engine settings chosen by the host builder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineSettings {
    pub fuel: bool,
    pub pooling: bool,
    /// Component instances the pool holds.
    pub pool_instances: u32,
}

fn base_config(fuel: bool) -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true)
        .epoch_interruption(true)
        .consume_fuel(fuel)
        .max_wasm_stack(MAX_WASM_STACK_BYTES)
        // The component-model async ABI is not part of poimen:plugin@0.1.0;
        // without it a store sets up less.
        .concurrency_support(false);
    c
}

fn pooling(instances: u32) -> PoolingAllocationConfig {
    let mut p = PoolingAllocationConfig::default();
    // A Rust component is a handful of core instances with one memory and a
    // few tables; leave room for larger ones.
    p.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(8))
        .total_memories(instances.saturating_mul(2))
        .total_tables(instances.saturating_mul(8))
        .total_stacks(instances)
        .total_gc_heaps(instances)
        .table_elements(MAX_TABLE_ELEMENTS / 8)
        // Return freed slots' pages to the kernel in batches rather than one
        // `madvise` per slot per call. (Keeping pages resident and zeroing
        // them instead measured slower: a Rust guest touches its stack at
        // the top of its first MiB.)
        .decommit_batch_size(DECOMMIT_BATCH);
    p
}

/// Freed instance slots decommitted per batch.
const DECOMMIT_BATCH: usize = 32;

/// An engine with the host's default settings, for the benchmark's bare
/// wasmtime baseline.
#[doc(hidden)]
pub fn default_engine() -> Engine {
    let settings = EngineSettings {
        fuel: true,
        pooling: true,
        pool_instances: (crate::limits::DEFAULT_MAX_CONCURRENT * 2) as u32,
    };
    match build(settings) {
        Ok((engine, _)) => engine,
        Err(_) => Engine::default(),
    }
}

/// Builds the engine: pooling if asked and the pool can be reserved,
/// otherwise on-demand.
pub(crate) fn build(settings: EngineSettings) -> Result<(Engine, AllocatorKind), String> {
    if settings.pooling {
        let mut c = base_config(settings.fuel);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(
            settings.pool_instances,
        )));
        if let Ok(engine) = Engine::new(&c) {
            return Ok((engine, AllocatorKind::Pooling));
        }
    }
    let c = base_config(settings.fuel);
    let engine = Engine::new(&c).map_err(|e| format!("{e:#}"))?;
    Ok((engine, AllocatorKind::OnDemand))
}

/// Starts the thread that advances the engine's epoch every [`EPOCH_TICK`].
/// It holds only a weak reference and stops when the engine is gone.
pub(crate) fn start_ticker(engine: &Engine) {
    let weak = engine.weak();
    let spawned = std::thread::Builder::new()
        .name("poimen-epoch".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        });
    // Without a ticker a spinning guest is still stopped by the invocation
    // timeout's timer (it just cannot yield); not worth failing the build.
    drop(spawned);
}

/// Feeds `Hash` output into Blake3.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.0.finalize().as_bytes()[..8]);
        u64::from_le_bytes(b)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The engine's compatibility hash (settings, wasmtime version, target), hex.
pub(crate) fn engine_hash(engine: &Engine) -> String {
    use std::hash::Hash;
    let mut h = Blake3Hasher(blake3::Hasher::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    h.0.finalize().to_hex()[..32].to_owned()
}

/// What the cache did for one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheOutcome {
    /// There is no cache directory.
    Disabled,
    /// Compiled now and written to the cache.
    Compiled,
    /// Read from the cache.
    Hit,
}

/// The on-disk cache of compiled components.
///
/// File layout: `<dir>/<digest hex>-<engine hash>.cwasm`, holding a magic
/// line, the Blake3 of the payload, and the payload (wasmtime's serialized
/// component). Files are written to a temporary name and renamed, so a
/// reader never sees half a file; the payload hash catches corruption.
#[derive(Debug, Clone)]
pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
    engine_hash: String,
}

const MAGIC: &[u8; 16] = b"poimen-cwasm-v1\n";

impl CompileCache {
    pub fn new(dir: Option<PathBuf>, engine: &Engine) -> Result<Self, String> {
        if let Some(d) = &dir {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
        }
        Ok(CompileCache {
            dir,
            engine_hash: engine_hash(engine),
        })
    }

    fn path(&self, dir: &Path, digest_hex: &str) -> PathBuf {
        dir.join(format!("{digest_hex}-{}.cwasm", self.engine_hash))
    }

    /// The compiled component for `bytes` (whose Blake3 is `digest_hex`).
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        digest_hex: &str,
    ) -> Result<(Component, CacheOutcome), String> {
        let Some(dir) = &self.dir else {
            let c = Component::new(engine, bytes).map_err(|e| format!("{e:#}"))?;
            return Ok((c, CacheOutcome::Disabled));
        };
        let path = self.path(dir, digest_hex);
        if let Some(c) = Self::read(engine, &path) {
            return Ok((c, CacheOutcome::Hit));
        }
        let c = Component::new(engine, bytes).map_err(|e| format!("{e:#}"))?;
        // A cache that cannot be written is a slower start, not a failure.
        if let Ok(payload) = c.serialize() {
            let _ = Self::write(&path, &payload);
        }
        Ok((c, CacheOutcome::Compiled))
    }

    fn read(engine: &Engine, path: &Path) -> Option<Component> {
        let file = std::fs::read(path).ok()?;
        let rest = file.strip_prefix(MAGIC.as_slice())?;
        let (hash, payload) = rest.split_at_checked(32)?;
        if blake3::hash(payload).as_bytes() != hash {
            return None;
        }
        // SAFETY: `Component::deserialize` trusts its input to be wasmtime's
        // own output for this engine. This file is: the host wrote it (see
        // `write`) under a name keyed by the component's digest and this
        // engine's compatibility hash, and its payload hash matches. The
        // cache directory must be private to poimen (see the crate docs);
        // wasmtime additionally checks the engine settings in the header.
        unsafe { Component::deserialize(engine, payload).ok() }
    }

    fn write(path: &Path, payload: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        use std::io::Write;
        tmp.write_all(MAGIC)?;
        tmp.write_all(blake3::hash(payload).as_bytes())?;
        tmp.write_all(payload)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAT: &str = r#"(component (core module (func (export "f"))))"#;

    fn engine() -> Engine {
        build(EngineSettings {
            fuel: true,
            pooling: false,
            pool_instances: 1,
        })
        .expect("engine")
        .0
    }

    #[test]
    fn the_cache_hits_the_second_time_and_survives_corruption() {
        let engine = engine();
        let dir = tempfile::tempdir().expect("dir");
        let bytes = wat_bytes();
        let digest = blake3::hash(&bytes).to_hex().to_string();
        let cache = CompileCache::new(Some(dir.path().to_owned()), &engine).expect("cache");
        let off = CompileCache::new(None, &engine).expect("no cache");
        assert_eq!(
            off.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Disabled
        );
        assert_eq!(
            cache.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Compiled
        );
        assert_eq!(
            cache.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Hit
        );
        let file = cache.path(dir.path(), &digest);
        let mut data = std::fs::read(&file).expect("read");
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(&file, data).expect("corrupt");
        assert_eq!(
            cache.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Compiled
        );
    }

    #[test]
    fn engine_settings_change_the_key() {
        let fueled = engine();
        let unfueled = build(EngineSettings {
            fuel: false,
            pooling: false,
            pool_instances: 1,
        })
        .expect("engine")
        .0;
        assert_ne!(engine_hash(&fueled), engine_hash(&unfueled));
        assert_eq!(engine_hash(&fueled), engine_hash(&engine()));
    }

    #[test]
    fn an_impossible_pool_falls_back_to_on_demand() {
        let (_, kind) = build(EngineSettings {
            fuel: true,
            pooling: true,
            pool_instances: u32::MAX / 8,
        })
        .expect("engine");
        assert_eq!(kind, AllocatorKind::OnDemand);
    }

    fn wat_bytes() -> Vec<u8> {
        WAT.as_bytes().to_vec()
    }
}
