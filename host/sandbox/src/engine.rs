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
        // No one component may take a large share of the pool: one that
        // needs more than this is refused at load, naming the limit.
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
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

/// Core instances one component may be made of. A Rust plugin is a
/// handful; the Python and JavaScript runtimes (componentize-py,
/// componentize-js) a few dozen at most.
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;

/// Linear memories one component may have.
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 8;

/// Tables one component may have.
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 64;

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
    /// Compiled now; written to the cache once the component was accepted.
    Compiled,
    /// Read from the cache.
    Hit,
}

/// How many bytes of compiled components the cache keeps by default; past
/// it, the least recently used files are deleted. (A Python component
/// compiles to about 40 MB, a Rust tool to under 1 MB.)
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

/// The on-disk cache of compiled components.
///
/// File layout: `<dir>/<digest hex>-<engine hash>.cwasm` is wasmtime's
/// serialized component as it is, and `<same>.mac` beside it holds a magic
/// line and the component file's MAC. Files are written to a temporary name
/// and renamed, so a reader never sees half a file.
///
/// The MAC is Blake3 keyed with this installation's secret
/// (`<dir>/.key`, 32 random bytes created on first use, readable by its
/// owner only) over the file's name and payload: a file planted in the
/// directory, copied from another installation or renamed to another
/// component's digest fails it and is never deserialized — the component is
/// compiled again and the file replaced. Corruption fails it too.
///
/// A hit hashes the file through one open descriptor and hands wasmtime
/// that same file (`/proc/self/fd/N`), which maps it instead of copying it:
/// a start reads and copies none of its compiled code (a start of the CLI
/// used to spend a third of its CPU reading ~20 MB of cached components into
/// fresh memory and copying them again). The file checked is the file
/// mapped; where `/proc` is missing, the bytes are read, checked and
/// deserialized from memory.
///
/// A compiled component is written only by [`keep`](Self::keep), once the
/// host accepted it: a refused component leaves nothing behind. The files
/// together stay under `max_bytes`; a hit refreshes a file's modification
/// time, and the oldest go first.
#[derive(Clone)]
pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
    engine_hash: String,
    max_bytes: u64,
    key: [u8; 32],
}

impl std::fmt::Debug for CompileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileCache")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// The magic line before a kept description's MAC and payload.
const MAGIC: &[u8; 16] = b"poimen-cwasm-v2\n";

/// The magic line of a compiled component's `.mac` file (then its MAC).
const MAC_MAGIC: &[u8; 16] = b"poimen-cwasm-v3\n";

/// The installation's cache key: read from `<dir>/.key`, or created there
/// (mode 0600) from the operating system's random source.
fn cache_key(dir: &Path) -> Result<[u8; 32], String> {
    let path = dir.join(".key");
    match std::fs::read(&path) {
        Ok(bytes) => {
            return bytes.as_slice().try_into().map_err(|_| {
                format!(
                    "{} is not a 32-byte cache key; delete it (the cache is rebuilt)",
                    path.display()
                )
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| format!("no random source for the cache key: {e}"))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| format!("cannot write a cache key in {}: {e}", dir.display()))?;
    {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| tmp.write_all(&key))
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    // Two processes starting at once: the first key wins, both use it.
    match tmp.persist_noclobber(&path) {
        Ok(_) => Ok(key),
        Err(_) => std::fs::read(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .as_slice()
            .try_into()
            .map_err(|_| format!("{} is not a 32-byte cache key", path.display())),
    }
}

impl CompileCache {
    pub fn new(dir: Option<PathBuf>, engine: &Engine, max_bytes: u64) -> Result<Self, String> {
        let key = match &dir {
            Some(d) => {
                std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
                cache_key(d)?
            }
            None => [0; 32],
        };
        Ok(CompileCache {
            dir,
            engine_hash: engine_hash(engine),
            max_bytes,
            key,
        })
    }

    fn path(&self, dir: &Path, digest_hex: &str) -> PathBuf {
        dir.join(format!("{digest_hex}-{}.cwasm", self.engine_hash))
    }

    /// Where what the component's `describe` returned is kept, beside its
    /// compiled form.
    fn described_path(path: &Path) -> PathBuf {
        path.with_extension("described")
    }

    /// Where a compiled component's MAC is kept, beside it.
    fn mac_path(path: &Path) -> PathBuf {
        path.with_extension("mac")
    }

    /// What a cached component's `describe` returned, if this host kept it
    /// (authenticated like the compiled form): a component is a pure
    /// function of its bytes, so its description is too, and a hit need not
    /// run its guest at load.
    pub fn described(&self, digest_hex: &str) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        let path = Self::described_path(&self.path(dir, digest_hex));
        let file = std::fs::read(&path).ok()?;
        self.authenticated(&path, &file).map(<[u8]>::to_vec)
    }

    /// Keeps what an accepted or withheld component's `describe` returned.
    pub fn keep_described(&self, digest_hex: &str, payload: &[u8]) {
        let Some(dir) = &self.dir else { return };
        let path = Self::described_path(&self.path(dir, digest_hex));
        let _ = self.write(&path, payload);
    }

    /// The compiled component for `bytes` (whose Blake3 is `digest_hex`),
    /// from the cache or compiled now (and not yet written).
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
        if let Some(c) = self.read(engine, &path) {
            // Recently used: the last to be evicted.
            if let Ok(f) = std::fs::File::options().append(true).open(&path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
            return Ok((c, CacheOutcome::Hit));
        }
        let c = Component::new(engine, bytes).map_err(|e| format!("{e:#}"))?;
        Ok((c, CacheOutcome::Compiled))
    }

    /// Writes an accepted component compiled by [`load`](Self::load), then
    /// evicts the least recently used files past the size limit. A cache
    /// that cannot be written is a slower next start, not a failure.
    pub fn keep(&self, component: &Component, digest_hex: &str, outcome: CacheOutcome) {
        let Some(dir) = &self.dir else { return };
        if outcome != CacheOutcome::Compiled {
            return;
        }
        let path = self.path(dir, digest_hex);
        if let Ok(payload) = component.serialize()
            && (payload.len() as u64).saturating_add(HEADER_BYTES) <= self.max_bytes
            && self.write_compiled(&path, &payload).is_ok()
        {
            self.evict(dir, &path);
        }
    }

    /// Deletes the oldest `.cwasm` files (never `keep`) until the rest fit.
    fn evict(&self, dir: &Path, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                let _ = std::fs::remove_file(Self::described_path(&path));
                let _ = std::fs::remove_file(Self::mac_path(&path));
                total = total.saturating_sub(len);
            }
        }
    }

    /// The MAC of a cache file: its name and payload under the key.
    fn mac(&self, path: &Path, payload: &[u8]) -> blake3::Hash {
        let mut h = self.mac_of_name(path);
        h.update(payload);
        h.finalize()
    }

    /// The MAC's hasher, past the file's name (the payload comes next).
    fn mac_of_name(&self, path: &Path) -> blake3::Hasher {
        let name = path
            .file_name()
            .map(|n| n.as_encoded_bytes())
            .unwrap_or_default();
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        h
    }

    /// The payload of the cache file at `path` whose contents are `file`,
    /// if its MAC proves this installation wrote it under this name.
    fn authenticated<'f>(&self, path: &Path, file: &'f [u8]) -> Option<&'f [u8]> {
        let rest = file.strip_prefix(MAGIC.as_slice())?;
        let (mac, payload) = rest.split_at_checked(32)?;
        // `blake3::Hash` compares in constant time.
        if self.mac(path, payload) != blake3::Hash::from_bytes(mac.try_into().ok()?) {
            return None;
        }
        Some(payload)
    }

    fn read(&self, engine: &Engine, path: &Path) -> Option<Component> {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let sealed = std::fs::read(Self::mac_path(path)).ok()?;
        let mac = sealed.strip_prefix(MAC_MAGIC.as_slice())?;
        let mac = blake3::Hash::from_bytes(mac.try_into().ok()?);
        let mut file = std::fs::File::open(path).ok()?;
        // The file just opened, by its descriptor: the name may be given to
        // another file meanwhile, this one stays what was checked.
        let opened = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        // SAFETY (both arms): `Component::deserialize*` trusts its input to
        // be wasmtime's own output for this engine. This file is: its MAC,
        // under a key only this installation holds, proves this host wrote
        // it (see `write_compiled`) under this name, which is keyed by the
        // component's digest and this engine's compatibility hash; wasmtime
        // additionally checks the engine settings in the header. Cache
        // files are only ever renamed into place, never written in place.
        if opened.exists() {
            let mut h = self.mac_of_name(path);
            h.update_reader(&file).ok()?;
            // `blake3::Hash` compares in constant time.
            if h.finalize() != mac {
                return None;
            }
            return unsafe { Component::deserialize_file(engine, &opened).ok() };
        }
        let mut payload = Vec::new();
        file.read_to_end(&mut payload).ok()?;
        if self.mac(path, &payload) != mac {
            return None;
        }
        unsafe { Component::deserialize(engine, &payload).ok() }
    }

    /// Writes a compiled component as wasmtime serialized it, then its MAC
    /// beside it (a reader finding either without the other, or another
    /// writer's, misses and compiles).
    fn write_compiled(&self, path: &Path, payload: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(payload)?;
        tmp.persist(path).map_err(|e| e.error)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(MAC_MAGIC)?;
        tmp.write_all(self.mac(path, payload).as_bytes())?;
        tmp.persist(Self::mac_path(path)).map_err(|e| e.error)?;
        Ok(())
    }

    fn write(&self, path: &Path, payload: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        use std::io::Write;
        tmp.write_all(MAGIC)?;
        tmp.write_all(self.mac(path, payload).as_bytes())?;
        tmp.write_all(payload)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The magic line and MAC kept with a cached payload (before a kept
/// description, in the `.mac` file beside a compiled component).
const HEADER_BYTES: u64 = 16 + 32;

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
        let cache =
            CompileCache::new(Some(dir.path().to_owned()), &engine, 1 << 20).expect("cache");
        let off = CompileCache::new(None, &engine, 1 << 20).expect("no cache");
        assert_eq!(
            off.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Disabled
        );
        let (c, outcome) = cache.load(&engine, &bytes, &digest).expect("load");
        assert_eq!(outcome, CacheOutcome::Compiled);
        // Not kept yet: compiled again.
        assert_eq!(
            cache.load(&engine, &bytes, &digest).expect("load").1,
            CacheOutcome::Compiled
        );
        cache.keep(&c, &digest, outcome);
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
    fn a_planted_or_renamed_cache_file_is_never_deserialized() {
        let engine = engine();
        let dir = tempfile::tempdir().expect("dir");
        let wats = [WAT, r#"(component (core module (func (export "g"))))"#];
        let digests: Vec<String> = wats
            .iter()
            .map(|w| blake3::hash(w.as_bytes()).to_hex().to_string())
            .collect();
        let cache =
            CompileCache::new(Some(dir.path().to_owned()), &engine, 1 << 20).expect("cache");
        for (w, d) in wats.iter().zip(&digests) {
            let (c, o) = cache.load(&engine, w.as_bytes(), d).expect("load");
            cache.keep(&c, d, o);
        }
        let key = std::fs::metadata(dir.path().join(".key")).expect("key");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key.permissions().mode() & 0o777, 0o600);
        // Another installation's file (another key), though well formed.
        let other = tempfile::tempdir().expect("dir");
        let theirs =
            CompileCache::new(Some(other.path().to_owned()), &engine, 1 << 20).expect("cache");
        let (c, o) = theirs
            .load(&engine, wats[0].as_bytes(), &digests[0])
            .expect("load");
        theirs.keep(&c, &digests[0], o);
        // Put `from` in the first component's place: it must not load.
        let planted_is_compiled_again = |from: PathBuf| {
            std::fs::copy(from, cache.path(dir.path(), &digests[0])).expect("plant");
            let (_, outcome) = cache
                .load(&engine, wats[0].as_bytes(), &digests[0])
                .expect("load");
            assert_eq!(outcome, CacheOutcome::Compiled);
        };
        // Their compiled file is byte for byte ours (compiling is
        // deterministic); their MAC file is not: their key is not ours.
        let ours = cache.path(dir.path(), &digests[0]);
        std::fs::copy(
            CompileCache::mac_path(&theirs.path(other.path(), &digests[0])),
            CompileCache::mac_path(&ours),
        )
        .expect("plant the MAC");
        planted_is_compiled_again(theirs.path(other.path(), &digests[0]));
        // A compiled file without its MAC file is compiled again.
        let (c, o) = cache
            .load(&engine, wats[0].as_bytes(), &digests[0])
            .expect("load");
        cache.keep(&c, &digests[0], o);
        std::fs::remove_file(CompileCache::mac_path(&ours)).expect("drop the MAC");
        assert_eq!(
            cache
                .load(&engine, wats[0].as_bytes(), &digests[0])
                .expect("load")
                .1,
            CacheOutcome::Compiled
        );
        // Our own file of the second component, renamed to the first's
        // digest (beside the first's own MAC file).
        let (c, o) = cache
            .load(&engine, wats[0].as_bytes(), &digests[0])
            .expect("load");
        cache.keep(&c, &digests[0], o);
        assert_eq!(
            cache
                .load(&engine, wats[0].as_bytes(), &digests[0])
                .expect("load")
                .1,
            CacheOutcome::Hit
        );
        planted_is_compiled_again(cache.path(dir.path(), &digests[1]));
        // The same key next time: its own files still hit.
        let again =
            CompileCache::new(Some(dir.path().to_owned()), &engine, 1 << 20).expect("cache");
        assert_eq!(
            again
                .load(&engine, wats[1].as_bytes(), &digests[1])
                .expect("load")
                .1,
            CacheOutcome::Hit
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

    #[test]
    fn the_cache_evicts_the_least_recently_used_past_its_size() {
        let engine = engine();
        let dir = tempfile::tempdir().expect("dir");
        let compiled: Vec<(Vec<u8>, String)> = (0..3)
            .map(|i| {
                let wat = format!(r#"(component (core module (func (export "f{i}"))))"#);
                let bytes = wat.into_bytes();
                let digest = blake3::hash(&bytes).to_hex().to_string();
                (bytes, digest)
            })
            .collect();
        let one = {
            let probe = CompileCache::new(Some(dir.path().join("probe")), &engine, u64::MAX)
                .expect("cache");
            let (c, o) = probe
                .load(&engine, &compiled[0].0, &compiled[0].1)
                .expect("load");
            probe.keep(&c, &compiled[0].1, o);
            std::fs::metadata(probe.path(&dir.path().join("probe"), &compiled[0].1))
                .expect("kept")
                .len()
        };
        // Room for two files, not three.
        let cache = CompileCache::new(Some(dir.path().to_owned()), &engine, one * 2 + one / 2)
            .expect("cache");
        let kept = |i: usize| cache.path(dir.path(), &compiled[i].1).exists();
        for (i, (bytes, digest)) in compiled.iter().enumerate() {
            let (c, o) = cache.load(&engine, bytes, digest).expect("load");
            cache.keep(&c, digest, o);
            assert!(kept(i));
            if i == 1 {
                // Use the first again: the second is now the oldest.
                std::thread::sleep(std::time::Duration::from_millis(20));
                assert_eq!(
                    cache
                        .load(&engine, &compiled[0].0, &compiled[0].1)
                        .expect("hit")
                        .1,
                    CacheOutcome::Hit
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        assert!(kept(0) && !kept(1) && kept(2));
        // A component larger than the whole cache is never written.
        let tiny = CompileCache::new(Some(dir.path().join("tiny")), &engine, 10).expect("cache");
        let (c, o) = tiny
            .load(&engine, &compiled[0].0, &compiled[0].1)
            .expect("load");
        tiny.keep(&c, &compiled[0].1, o);
        let cwasm = std::fs::read_dir(dir.path().join("tiny"))
            .expect("ls")
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .count();
        assert_eq!(cwasm, 0);
    }

    fn wat_bytes() -> Vec<u8> {
        WAT.as_bytes().to_vec()
    }
}
