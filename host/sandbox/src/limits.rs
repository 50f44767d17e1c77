//! Per-invocation limits: their defaults, each a named constant, and the
//! memory limiter that enforces one of them inside a `Store`.
//!
//! What a limit is overridden to (by policy, by the caller) is decided in
//! `policy` and `host`; this module only holds the numbers and the
//! `ResourceLimiter`. It knows nothing of WASI or of records.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Wall-clock time one invocation may take, instantiation included. A tight
/// loop is interrupted by the epoch ticker; a guest blocked in a host call
/// (an HTTP request) by the same timer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Linear memory one invocation may grow to, summed over its memories.
/// Far above [`DEFAULT_OUTPUT_BYTES`], so a guest that builds an oversized
/// result is refused for the result, not for memory: building a 100 MiB
/// JSON text by appending (each doubling of the buffer a fresh block the
/// allocator cannot reuse) takes about 260 MiB of linear memory.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;

/// Fuel (roughly, WebAssembly instructions) one invocation may burn, when
/// the host meters fuel. About ten seconds of straight-line work: the wall
/// clock usually stops a runaway guest first; fuel makes the budget
/// deterministic.
pub const DEFAULT_FUEL: u64 = 20_000_000_000;

/// Size of a tool's JSON result (or of a verifier's reason) in bytes.
pub const DEFAULT_OUTPUT_BYTES: u64 = 16 << 20;

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

/// The limits one invocation runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallLimits {
    /// Wall-clock time, in milliseconds when serialized.
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    pub memory_bytes: u64,
    /// `None` when the host does not meter fuel.
    pub fuel: Option<u64>,
    pub output_bytes: u64,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            timeout: DEFAULT_TIMEOUT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            fuel: Some(DEFAULT_FUEL),
            output_bytes: DEFAULT_OUTPUT_BYTES,
        }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
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
}

impl MemoryLimiter {
    pub fn new(limit: u64) -> Self {
        MemoryLimiter { limit, in_use: 0 }
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
    fn limits_serialize_with_units_in_names() {
        let v = serde_json::to_value(CallLimits::default()).expect("json");
        assert_eq!(v["timeout_ms"], 10_000);
        assert_eq!(v["memory_bytes"], DEFAULT_MEMORY_BYTES);
        let back: CallLimits = serde_json::from_value(v).expect("back");
        assert_eq!(back, CallLimits::default());
    }
}
