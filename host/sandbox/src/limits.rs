//! Per-invocation limits: their defaults, each a named constant (the
//! [`CallLimits`] a call runs under are `poimen-policy`'s, re-exported), the
//! memory limiter that enforces one of them inside a `Store`, and the error
//! any other exhausted resource traps the guest with.
//!
//! What a limit is overridden to (by policy, by the caller) is decided in
//! `policy` and `host`; this module only holds the numbers, the
//! `ResourceLimiter` and [`LimitHit`]. It knows nothing of WASI or of
//! records.

use std::time::Duration;

pub use poimen_policy::limits::*;

/// How much of the guest's stderr is kept in the record.
pub const STDERR_CAPTURE_BYTES: usize = 16 << 10;

/// Length kept of a tool error's message.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4 << 10;

/// The WebAssembly call stack, an engine setting (not per call).
pub const MAX_WASM_STACK_BYTES: usize = 1 << 20;

/// Elements any one table may grow to.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// How often the epoch ticker ticks. Each tick a running guest yields to
/// the async executor, so a dropped invocation stops within about a tick.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Invocations running at once on one host; more wait for a slot. Sized so
/// the pooling allocator never runs out of instance slots.
pub const DEFAULT_MAX_CONCURRENT: usize = 128;

/// Bytes a guest may pass to the host in one host call (a path, a buffer
/// to write, header fields): wasmtime's "hostcall fuel". A larger transfer
/// traps before the host allocates it.
pub const MAX_HOSTCALL_BYTES: usize = 16 << 20;

/// Length of a path a guest may hand the filesystem, and of the path it
/// resolves to (Linux's `PATH_MAX`). Longer is refused with
/// `name-too-long` before anything is resolved or recorded.
pub const MAX_PATH_BYTES: usize = 4096;

/// How deep below its mount a guest may create a directory or file. (A
/// tree can still grow deeper by renames; deleting one never recurses.)
pub const MAX_DIRECTORY_DEPTH: usize = 64;

/// Host calls recorded one by one per invocation; past it they are counted
/// per function ([`Omitted`](crate::record::Omitted)).
pub const JOURNAL_MAX_ENTRIES: usize = 2048;

/// Bytes of host-call arguments and results recorded per invocation; past
/// it calls are counted, not recorded.
pub const JOURNAL_MAX_BYTES: usize = 256 << 10;

/// Length kept of one recorded argument or result text.
pub const JOURNAL_MAX_FIELD_BYTES: usize = 512;

/// Refusals recorded one by one per invocation (the first one decides the
/// invocation's error); past it they are counted.
pub const MAX_REFUSALS: usize = 64;

/// A bounded resource of one call, other than linear memory, fuel and time
/// (which have their own errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// Files and directories open at once ([`CallLimits::open_files`]).
    OpenFiles,
    /// Bytes written through writable mounts ([`CallLimits::disk_bytes`]).
    DiskBytes,
    /// Depth below a mount of a created directory or file
    /// ([`MAX_DIRECTORY_DEPTH`]).
    DirectoryDepth,
    /// Resources held at once ([`CallLimits::handles`]).
    Handles,
    /// Bytes passed to the host in one call ([`MAX_HOSTCALL_BYTES`]).
    HostcallBytes,
    /// Values in the result ([`CallLimits::output_nodes`]).
    OutputValues,
}

impl Resource {
    /// What it is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Resource::OpenFiles => "files open at once",
            Resource::DiskBytes => "bytes written to disk",
            Resource::DirectoryDepth => "directory depth below a mount",
            Resource::Handles => "resources held at once",
            Resource::HostcallBytes => "bytes passed to the host in one call",
            Resource::OutputValues => "JSON values in the result",
        }
    }

    /// The policy key that raises it (`[plugins.NAME] limits = { … }`),
    /// if the policy can.
    pub fn policy_key(self) -> Option<&'static str> {
        match self {
            Resource::OpenFiles => Some("open-files"),
            Resource::DiskBytes => Some("disk-bytes"),
            Resource::Handles => Some("handles"),
            Resource::OutputValues => Some("output-nodes"),
            Resource::DirectoryDepth | Resource::HostcallBytes => None,
        }
    }
}

/// The error a guest is trapped with when a call exhausts a [`Resource`];
/// `host` turns it into
/// [`InvokeError::ResourceExhausted`](crate::InvokeError::ResourceExhausted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call reached its limit of {limit} {}", .resource.describe())]
pub(crate) struct LimitHit {
    pub resource: Resource,
    pub limit: u64,
}

/// The error a memory growth past the limit traps with; `host` turns it
/// into [`InvokeError::MemoryExhausted`](crate::InvokeError::MemoryExhausted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("memory limit of {limit} bytes reached (asked for {requested} bytes in total)")]
pub(crate) struct MemoryLimitHit {
    pub limit: u64,
    pub requested: u64,
}

/// Enforces [`CallLimits::memory_bytes`] over all of a store's memories, and
/// [`MAX_TABLE_ELEMENTS`]. A growth past the limit traps (rather than making
/// `memory.grow` return -1) so the failure is attributed to the limit, not
/// to whatever the guest does when its allocator fails.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limit: u64,
    in_use: u64,
    /// The most `in_use` has been: linear memory (which never shrinks)
    /// plus what the host held for the guest at that moment.
    peak: u64,
}

impl MemoryLimiter {
    pub fn new(limit: u64) -> Self {
        MemoryLimiter {
            limit,
            in_use: 0,
            peak: 0,
        }
    }

    /// Charges `bytes` the host keeps on the guest's behalf (header fields
    /// it built, a directory listing) to the same budget as its linear
    /// memory.
    pub fn charge_host(&mut self, bytes: u64) -> Result<(), MemoryLimitHit> {
        let requested = self.in_use.saturating_add(bytes);
        if requested > self.limit {
            return Err(MemoryLimitHit {
                limit: self.limit,
                requested,
            });
        }
        self.in_use = requested;
        self.peak = self.peak.max(requested);
        Ok(())
    }

    /// The most memory the call held at once, in bytes: its linear
    /// memories and what the host kept on its behalf.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Gives back what [`charge_host`](Self::charge_host) took, once the
    /// host no longer holds it.
    pub fn release_host(&mut self, bytes: u64) {
        self.in_use = self.in_use.saturating_sub(bytes);
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let grow = desired.saturating_sub(current) as u64;
        let requested = self.in_use.saturating_add(grow);
        if requested > self.limit {
            return Err(MemoryLimitHit {
                limit: self.limit,
                requested,
            }
            .into());
        }
        self.in_use = requested;
        self.peak = self.peak.max(requested);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_is_summed_over_memories_and_trapped_past_the_limit() {
        let mut l = MemoryLimiter::new(100);
        assert!(matches!(l.memory_growing(0, 60, None), Ok(true)));
        assert!(matches!(l.memory_growing(0, 40, None), Ok(true)));
        let err = l.memory_growing(40, 41, None).expect_err("over");
        assert_eq!(
            err.downcast_ref::<MemoryLimitHit>(),
            Some(&MemoryLimitHit {
                limit: 100,
                requested: 101
            })
        );
    }

    #[test]
    fn host_bytes_share_the_memory_budget() {
        let mut l = MemoryLimiter::new(100);
        assert!(matches!(l.memory_growing(0, 60, None), Ok(true)));
        assert_eq!(l.charge_host(40), Ok(()));
        assert_eq!(
            l.charge_host(1),
            Err(MemoryLimitHit {
                limit: 100,
                requested: 101
            })
        );
        assert!(l.memory_growing(60, 61, None).is_err(), "host bytes count");
        assert_eq!(l.peak(), 100, "the peak counts host bytes with memory");
    }
}
