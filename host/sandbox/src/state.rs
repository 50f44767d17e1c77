//! The `Store` data of one invocation: a WASI context built from the
//! invocation's grants alone, and the deterministic clocks, random source
//! and stdio capture behind the baseline imports.
//!
//! Nothing here is inherited from the host process: no environment, no
//! arguments, no stdin, no stdout or stderr (both captured), no OS clock,
//! no OS randomness, preopens only for granted mounts, HTTP only to granted
//! hosts. What the call may make the host hold is bounded here too: the
//! resource table holds at most `handles` entries, and every header byte the
//! guest hands `wasi:http` is charged to its memory (`link` shadows the
//! functions that take them). It knows nothing of components or registries.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use poimen_workflow::Capability;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{
    FsPerms, HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};
use wasmtime_wasi_io::IoView;
use wasmtime_wasi_io::bytes::Bytes;
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{OutputStream, StreamResult};

use crate::fs::{FsTracker, Mount, RecordedFilesystem, RecordingFs};
use crate::http::HttpGate;
use crate::limits::{CallLimits, MemoryLimiter};
use crate::policy::Grant;
use crate::record::{Baseline, Captured, Journal};
use crate::scratch::{ScratchDir, ScratchRoot};
use crate::sockets::{DeniedSockets, Denying};

/// What `wasi:clocks/wall-clock` says it is: 2000-01-01T00:00:00Z, for every
/// call. A tool that needs the time gets it in its arguments, from the
/// executor's recorded clock; a clock read inside a guest would make the
/// call unrepeatable.
pub const FROZEN_WALL_CLOCK: Duration = Duration::from_secs(946_684_800);

// Files' timestamps show the same frozen time (`fs.rs`).
const _: () = assert!(crate::fs::FROZEN_STAT_SECS == FROZEN_WALL_CLOCK.as_secs());

/// How far `wasi:clocks/monotonic-clock` advances per read, in nanoseconds:
/// time passes (so elapsed-time loops end) but the same calls see the same
/// times.
pub const MONOTONIC_STEP_NS: u64 = 1_000;

/// Counters shared between the store data and the clock and RNG objects
/// the WASI context owns.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    wall_reads: AtomicU64,
    monotonic_reads: AtomicU64,
    random_words: AtomicU64,
}

struct FrozenWallClock(Arc<Counters>);

impl HostWallClock for FrozenWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        self.0.wall_reads.fetch_add(1, Ordering::Relaxed);
        FROZEN_WALL_CLOCK
    }
}

struct SteppingClock(Arc<Counters>);

impl HostMonotonicClock for SteppingClock {
    fn resolution(&self) -> u64 {
        MONOTONIC_STEP_NS
    }

    fn now(&self) -> u64 {
        let n = self.0.monotonic_reads.fetch_add(1, Ordering::Relaxed);
        n.saturating_add(1).saturating_mul(MONOTONIC_STEP_NS)
    }
}

/// A random source that is a pure function of its seed: Blake3 in XOF mode.
struct SeededRng {
    reader: blake3::OutputReader,
    counters: Arc<Counters>,
}

impl SeededRng {
    fn new(seed: &[u8; 32], stream: &str, counters: Arc<Counters>) -> Self {
        let mut h = blake3::Hasher::new_keyed(seed);
        h.update(stream.as_bytes());
        SeededRng {
            reader: h.finalize_xof(),
            counters,
        }
    }
}

impl rand::TryRng for SeededRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut b = [0; 4];
        self.try_fill_bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut b = [0; 8];
        self.try_fill_bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.counters
            .random_words
            .fetch_add(dst.len().div_ceil(4) as u64, Ordering::Relaxed);
        self.reader.fill(dst);
        Ok(())
    }
}

/// The seed of an invocation's random sources: its idempotency key and the
/// hash of its arguments. A retry with the same key sees the same numbers.
pub(crate) fn seed(key: &str, args_hash: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("poimen sandbox 2024 random seed v1");
    h.update(key.as_bytes());
    h.update(&[0]);
    h.update(args_hash.as_bytes());
    *h.finalize().as_bytes()
}

/// The guest's stdout and stderr, captured together in the order written
/// (a Python `print()` and a traceback read as they happened), bounded: the
/// first `head` bytes and the last `tail` bytes are kept, everything is
/// counted per stream, and a guest's write never fails.
///
/// Each `Capture` is one stream's handle on the shared buffer.
#[derive(Clone)]
pub(crate) struct Capture {
    inner: Arc<Mutex<CaptureInner>>,
    stream: Stream,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

struct CaptureInner {
    head: Vec<u8>,
    /// The last `tail_cap` bytes written after `head` filled up.
    tail: std::collections::VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    /// Bytes dropped between `head` and `tail`.
    omitted: u64,
    stdout_total: u64,
    stderr_total: u64,
}

impl Capture {
    /// A stdout and a stderr sharing one buffer of about `cap` bytes: a
    /// quarter for the beginning, the rest for the end (where a traceback
    /// or a panic message is).
    pub fn pair(cap: usize) -> (Capture, Capture) {
        let head_cap = cap / 4;
        let inner = Arc::new(Mutex::new(CaptureInner {
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            head_cap,
            tail_cap: cap - head_cap,
            omitted: 0,
            stdout_total: 0,
            stderr_total: 0,
        }));
        (
            Capture {
                inner: inner.clone(),
                stream: Stream::Stdout,
            },
            Capture {
                inner,
                stream: Stream::Stderr,
            },
        )
    }

    fn push(&self, mut bytes: &[u8]) {
        let mut c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match self.stream {
            Stream::Stdout => c.stdout_total += bytes.len() as u64,
            Stream::Stderr => c.stderr_total += bytes.len() as u64,
        }
        let room = c.head_cap.saturating_sub(c.head.len());
        let take = room.min(bytes.len());
        c.head.extend_from_slice(&bytes[..take]);
        bytes = &bytes[take..];
        if bytes.len() > c.tail_cap {
            let skip = bytes.len() - c.tail_cap;
            c.omitted += (skip + c.tail.len()) as u64;
            c.tail.clear();
            bytes = &bytes[skip..];
        }
        let over = (c.tail.len() + bytes.len()).saturating_sub(c.tail_cap);
        c.tail.drain(..over);
        c.omitted += over as u64;
        c.tail.extend(bytes);
    }

    /// Bytes this stream was sent.
    pub fn total(&self) -> u64 {
        let c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match self.stream {
            Stream::Stdout => c.stdout_total,
            Stream::Stderr => c.stderr_total,
        }
    }

    /// What was kept of both streams.
    pub fn captured(&self) -> Captured {
        let c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::from_utf8_lossy(&c.head).into_owned();
        if c.omitted > 0 {
            text.push_str(&format!("\n[… {} bytes not kept …]\n", c.omitted));
        }
        let (a, b) = c.tail.as_slices();
        text.push_str(&String::from_utf8_lossy(&[a, b].concat()));
        Captured {
            text,
            truncated: c.omitted > 0,
            omitted_bytes: c.omitted,
        }
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi_io::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The data of one invocation's `Store`.
pub(crate) struct CallState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    gate: HttpGate,
    fs: FsTracker,
    pub journal: Journal,
    pub limiter: MemoryLimiter,
    counters: Arc<Counters>,
    stdout: Capture,
    stderr: Capture,
    /// The scratch directory, deleted when the invocation ends.
    _scratch: Option<ScratchDir>,
    /// How deep the host is in calls into the guest (a host call's result
    /// is handed over by calling the guest's allocator).
    pub wasm_depth: usize,
}

impl CallState {
    /// Builds the WASI context from `grants` alone, bounded by `limits`; a
    /// `scratch` grant gets a fresh directory under `scratch_root`.
    pub fn new(
        grants: &[Grant],
        seed: &[u8; 32],
        limits: &CallLimits,
        stderr_cap: usize,
        scratch_root: Option<&ScratchRoot>,
    ) -> Result<Self, String> {
        let counters = Arc::new(Counters::default());
        let (stdout, stderr) = Capture::pair(stderr_cap);
        let journal = Journal::default();
        let mut b = WasiCtxBuilder::new();
        b.stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(FrozenWallClock(counters.clone()))
            .monotonic_clock(SteppingClock(counters.clone()))
            .secure_random(SeededRng::new(seed, "secure", counters.clone()))
            .insecure_random(SeededRng::new(seed, "insecure", counters.clone()))
            .insecure_random_seed(u128::from_le_bytes(
                blake3::keyed_hash(seed, b"insecure-seed").as_bytes()[..16]
                    .try_into()
                    .unwrap_or([0; 16]),
            ))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);

        let mut fs = FsTracker::new(limits.open_files, limits.disk_bytes);
        let mut allow = Vec::new();
        let mut scratch = None;
        for g in grants {
            let (mount, host, perms) = match &g.capability {
                Capability::FilesystemRead { mount } => {
                    (mount.clone(), g.host_dir.clone(), FsPerms::ReadOnly)
                }
                Capability::FilesystemWrite { mount } => {
                    (mount.clone(), g.host_dir.clone(), FsPerms::ReadWrite)
                }
                Capability::Scratch => {
                    let root =
                        scratch_root.ok_or_else(|| "this host has no scratch space".to_owned())?;
                    let dir = root
                        .call_dir()
                        .map_err(|e| format!("cannot create the scratch directory: {e}"))?;
                    let path = dir.path().to_owned();
                    scratch = Some(dir);
                    (
                        poimen_workflow::capability::SCRATCH_MOUNT.to_owned(),
                        Some(path),
                        FsPerms::ReadWrite,
                    )
                }
                Capability::Http => {
                    for h in &g.hosts {
                        allow.push(crate::policy::HttpAllow::parse(h)?);
                    }
                    continue;
                }
            };
            let Some(host) = host else {
                return Err(format!("grant `{}` has no host directory", g.capability));
            };
            b.preopened_dir(&host, &mount, perms).map_err(|e| {
                format!(
                    "granted directory {} for `{}`: {e}",
                    host.display(),
                    g.capability
                )
            })?;
            fs.mounts.push(Mount {
                guest: mount,
                writable: matches!(perms, FsPerms::ReadWrite),
                capability: g.capability.to_string(),
            });
        }
        let mut table = ResourceTable::new();
        table.set_max_capacity(usize::try_from(limits.handles).unwrap_or(usize::MAX));
        Ok(CallState {
            table,
            wasi: b.build(),
            http: WasiHttpCtx::new(),
            gate: HttpGate {
                allow: allow.into(),
                journal: journal.clone(),
            },
            fs,
            journal,
            limiter: MemoryLimiter::new(limits.memory_bytes),
            counters,
            stdout,
            stderr,
            _scratch: scratch,
            wasm_depth: 0,
        })
    }

    /// What the filesystem wrapper works on.
    pub fn filesystem(&mut self) -> RecordingFs<'_> {
        RecordingFs {
            inner: wasmtime_wasi::filesystem::WasiFilesystemCtxView {
                ctx: self.wasi.filesystem(),
                table: &mut self.table,
            },
            tracker: &mut self.fs,
            journal: &self.journal,
            limiter: &mut self.limiter,
        }
    }

    /// Charges header bytes the guest hands `wasi:http` to its memory.
    fn charge_fields(&mut self, bytes: usize) -> wasmtime::Result<()> {
        self.limiter
            .charge_host(bytes as u64)
            .map_err(wasmtime::Error::new)
    }

    /// What the denying `wasi:sockets` interfaces work on.
    fn sockets_denied(&mut self) -> Denying<'_> {
        Denying {
            journal: &self.journal,
            inner: wasmtime_wasi::sockets::WasiSocketsCtxView {
                ctx: self.wasi.sockets(),
                table: &mut self.table,
            },
        }
    }

    pub fn baseline(&self) -> Baseline {
        Baseline {
            wall_clock_reads: self.counters.wall_reads.load(Ordering::Relaxed),
            monotonic_clock_reads: self.counters.monotonic_reads.load(Ordering::Relaxed),
            random_words: self.counters.random_words.load(Ordering::Relaxed),
            stdout_bytes: self.stdout.total(),
            stderr_bytes: self.stderr.total(),
        }
    }

    pub fn stderr(&self) -> Captured {
        self.stderr.captured()
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl IoView for CallState {
    fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.gate,
        }
    }
}

/// Puts every interface the host serves into `linker`: the baseline ones
/// from wasmtime-wasi, the filesystem through the recording wrapper,
/// `wasi:http` through the allowlist hook, and `wasi:sockets` denied.
pub(crate) fn link(linker: &mut wasmtime::component::Linker<CallState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::WasiCli;
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
    use wasmtime_wasi::random::WasiRandom;

    let l = linker;
    wasmtime_wasi_io::add_to_linker_async(l)?;
    clocks::wall_clock::add_to_linker::<CallState, WasiClocks>(
        l,
        <CallState as wasmtime_wasi::clocks::WasiClocksView>::clocks,
    )?;
    clocks::monotonic_clock::add_to_linker::<CallState, WasiClocks>(
        l,
        <CallState as wasmtime_wasi::clocks::WasiClocksView>::clocks,
    )?;
    random::random::add_to_linker::<CallState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure::add_to_linker::<CallState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure_seed::add_to_linker::<CallState, WasiRandom>(l, |s| s.wasi.random())?;
    let cli_view = <CallState as wasmtime_wasi::cli::WasiCliView>::cli;
    cli::exit::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::environment::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::stdin::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::stdout::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::stderr::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::terminal_input::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::terminal_output::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::terminal_stdin::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::terminal_stdout::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    cli::terminal_stderr::add_to_linker::<CallState, WasiCli>(l, cli_view)?;
    filesystem::types::add_to_linker::<CallState, RecordedFilesystem>(l, CallState::filesystem)?;
    filesystem::preopens::add_to_linker::<CallState, RecordedFilesystem>(l, CallState::filesystem)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(l)?;
    // `wasi:sockets`: every way to a socket denied and recorded
    // (`sockets.rs`); the rest is wasmtime-wasi's, over a context that
    // allows nothing, with no socket to act on.
    use wasmtime_wasi::p2::bindings::sockets;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView};
    let view = <CallState as WasiSocketsView>::sockets;
    sockets::tcp::add_to_linker::<CallState, WasiSockets>(l, view)?;
    sockets::udp::add_to_linker::<CallState, WasiSockets>(l, view)?;
    sockets::instance_network::add_to_linker::<CallState, WasiSockets>(l, view)?;
    sockets::network::add_to_linker::<CallState, WasiSockets>(l, &Default::default(), view)?;
    sockets::tcp_create_socket::add_to_linker::<CallState, DeniedSockets>(
        l,
        CallState::sockets_denied,
    )?;
    sockets::udp_create_socket::add_to_linker::<CallState, DeniedSockets>(
        l,
        CallState::sockets_denied,
    )?;
    sockets::ip_name_lookup::add_to_linker::<CallState, DeniedSockets>(
        l,
        CallState::sockets_denied,
    )?;
    shadow_http_fields(l)
}

/// The `wasi:http/types` interface as wasmtime-wasi-http's bindings name it.
const HTTP_TYPES: &str = "wasi:http/types@0.2.12";

/// Replaces the `wasi:http` functions that take header bytes from the guest
/// with ones that first charge those bytes to the call's memory, then do
/// what wasmtime-wasi-http does. A header the guest built may live on in a
/// request the host holds, and the host cannot tell when that lets go: the
/// charge stands until the call ends. (Without this a guest kept under
/// 512 MiB of linear memory could make the host hold gigabytes of fields.)
fn shadow_http_fields(l: &mut wasmtime::component::Linker<CallState>) -> wasmtime::Result<()> {
    use wasmtime::StoreContextMut;
    use wasmtime::component::Resource;
    use wasmtime_wasi_http::FieldMap;
    use wasmtime_wasi_http::p2::HeaderResult;
    use wasmtime_wasi_http::p2::bindings::http::types::{HeaderError, HostFields};

    type Store<'a> = StoreContextMut<'a, CallState>;

    /// The guest's view of a header function's result.
    fn answer<T>(r: HeaderResult<T>) -> wasmtime::Result<(Result<T, HeaderError>,)> {
        Ok((match r {
            Ok(v) => Ok(v),
            Err(e) => Err(e.downcast()?),
        },))
    }

    l.allow_shadowing(true);
    let mut types = l.instance(HTTP_TYPES)?;
    types.func_wrap(
        "[static]fields.from-list",
        |mut s: Store<'_>, (entries,): (Vec<(String, Vec<u8>)>,)| {
            let bytes = entries.iter().map(|(n, v)| n.len() + v.len()).sum();
            s.data_mut().charge_fields(bytes)?;
            answer(HostFields::from_list(&mut s.data_mut().http(), entries))
        },
    )?;
    types.func_wrap(
        "[method]fields.set",
        |mut s: Store<'_>, (fields, name, values): (Resource<FieldMap>, String, Vec<Vec<u8>>)| {
            let bytes = values.iter().map(|v| name.len() + v.len()).sum();
            s.data_mut().charge_fields(bytes)?;
            answer(HostFields::set(
                &mut s.data_mut().http(),
                fields,
                name,
                values,
            ))
        },
    )?;
    types.func_wrap(
        "[method]fields.append",
        |mut s: Store<'_>, (fields, name, value): (Resource<FieldMap>, String, Vec<u8>)| {
            s.data_mut().charge_fields(name.len() + value.len())?;
            answer(HostFields::append(
                &mut s.data_mut().http(),
                fields,
                name,
                value,
            ))
        },
    )?;
    types.func_wrap(
        "[method]fields.clone",
        |mut s: Store<'_>, (fields,): (Resource<FieldMap>,)| {
            let bytes = s
                .data_mut()
                .table
                .get(&fields)?
                .iter()
                .map(|(n, v)| n.as_str().len() + v.len())
                .sum();
            s.data_mut().charge_fields(bytes)?;
            Ok((HostFields::clone(&mut s.data_mut().http(), fields)?,))
        },
    )?;
    l.allow_shadowing(false);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn randomness_is_a_function_of_key_and_args() {
        let c = Arc::new(Counters::default());
        let draw = |key: &str| {
            let mut r = SeededRng::new(&seed(key, "b3:args"), "secure", c.clone());
            (r.next_u64(), r.next_u64())
        };
        assert_eq!(draw("k1"), draw("k1"));
        assert_ne!(draw("k1"), draw("k2"));
        assert_ne!(seed("k", "b3:a"), seed("k", "b3:b"));
        assert_eq!(c.random_words.load(Ordering::Relaxed), 4 * 2 * 2);
    }

    #[test]
    fn clocks_are_deterministic_and_counted() {
        let c = Arc::new(Counters::default());
        let wall = FrozenWallClock(c.clone());
        assert_eq!(wall.now(), FROZEN_WALL_CLOCK);
        let mono = SteppingClock(c.clone());
        assert_eq!(
            (mono.now(), mono.now()),
            (MONOTONIC_STEP_NS, 2 * MONOTONIC_STEP_NS)
        );
        assert_eq!(c.wall_reads.load(Ordering::Relaxed), 1);
        assert_eq!(c.monotonic_reads.load(Ordering::Relaxed), 2);
    }

    fn limits() -> CallLimits {
        CallLimits {
            memory_bytes: 1 << 20,
            ..CallLimits::default()
        }
    }

    #[test]
    fn scratch_is_a_fresh_directory_that_goes_away() {
        let grant = Grant {
            capability: Capability::Scratch,
            host_dir: None,
            hosts: Vec::new(),
        };
        let base = tempfile::tempdir().expect("base");
        let root = ScratchRoot::create(base.path()).expect("root");
        let state = CallState::new(
            std::slice::from_ref(&grant),
            &[0; 32],
            &limits(),
            64,
            Some(&root),
        )
        .expect("state");
        let dir = state
            ._scratch
            .as_ref()
            .map(|d| d.path().to_owned())
            .expect("scratch");
        assert!(dir.is_dir());
        assert_eq!(std::fs::read_dir(&dir).expect("ls").count(), 0);
        assert_eq!(state.fs.mounts[0].guest, "/scratch");
        assert!(state.fs.mounts[0].writable);
        assert!(dir.starts_with(root.dir()), "under the host's scratch root");
        drop(state);
        assert!(!dir.exists());
        assert!(
            CallState::new(&[grant], &[0; 32], &limits(), 64, None).is_err(),
            "no scratch root, no scratch"
        );
    }

    #[test]
    fn a_grant_without_its_directory_is_a_host_failure() {
        let grant = Grant {
            capability: "fs-read:/data".parse().expect("cap"),
            host_dir: Some("/nonexistent/poimen".into()),
            hosts: Vec::new(),
        };
        let e = CallState::new(&[grant], &[0; 32], &limits(), 64, None)
            .err()
            .expect("fails");
        assert!(e.contains("/nonexistent/poimen"), "{e}");
    }

    #[test]
    fn capture_keeps_both_streams_in_order_with_their_beginning_and_end() {
        let (out, err) = Capture::pair(8);
        out.push(b"ab");
        err.push(b"cd");
        assert_eq!(
            out.captured(),
            Captured {
                text: "abcd".into(),
                truncated: false,
                omitted_bytes: 0,
            }
        );
        err.push(b"efghijkl");
        out.push(b"mn");
        assert_eq!((out.total(), err.total()), (4, 10));
        let kept = err.captured();
        assert_eq!(kept.omitted_bytes, 6);
        assert!(kept.truncated);
        assert_eq!(kept.text, "ab\n[… 6 bytes not kept …]\nijklmn");
        // One write larger than the whole tail keeps its own end.
        let (_, err) = Capture::pair(8);
        err.push(&[b'x'; 100]);
        err.push(b"END");
        let kept = err.captured();
        assert!(kept.text.ends_with("xxxEND"), "{}", kept.text);
        assert_eq!(kept.omitted_bytes, 100 + 3 - 2 - 6);
    }
}
