//! The limits one guest call runs under ([`CallLimits`]) and their defaults,
//! each a named constant.
//!
//! Every resource a call can make the host hold is bounded here and
//! charged to the call: its linear memory (and the host-side bytes it makes
//! the host keep, such as HTTP header fields), fuel, wall time, the size
//! and the node count of its result, the files it holds open, the bytes it
//! writes to disk, and the resources (handles) it holds. What a limit is
//! overridden to is decided by the policy (its `LimitOverrides`)
//! and the caller; enforcing them is the sandbox's job.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Wall-clock time one invocation may take, instantiation included. A tight
/// loop is interrupted by the epoch ticker; a guest blocked in a host call
/// (an HTTP request) by the same timer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Memory one invocation may make the host hold: its linear memories
/// summed, plus the host-side bytes it makes the host keep on its behalf
/// (HTTP header fields). Far above [`DEFAULT_OUTPUT_BYTES`], so a guest that
/// builds an oversized result is refused for the result, not for memory:
/// building a 100 MiB JSON text by appending (each doubling of the buffer a
/// fresh block the allocator cannot reuse) takes about 260 MiB of linear
/// memory.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;

/// Fuel (roughly, WebAssembly instructions) one invocation may burn, when
/// the host meters fuel. About ten seconds of straight-line work: the wall
/// clock usually stops a runaway guest first; fuel makes the budget
/// deterministic.
pub const DEFAULT_FUEL: u64 = 20_000_000_000;

/// Size of a tool's JSON result (or of a verifier's reason) in bytes.
pub const DEFAULT_OUTPUT_BYTES: u64 = 16 << 20;

/// Values (objects, arrays, strings, numbers, booleans, nulls) in a tool's
/// JSON result. Bytes alone do not bound what a result costs the host: a
/// few megabytes of `{}` are a million values, each tens of bytes once
/// parsed, and a run keeps what its steps return.
pub const DEFAULT_OUTPUT_NODES: u64 = 1 << 18;

/// Files and directories one invocation may hold open at once (each is a
/// descriptor of the host process).
pub const DEFAULT_OPEN_FILES: u32 = 128;

/// Bytes one invocation may write through its writable mounts (`scratch`
/// and `fs-write`), counted as written (a file extended by `set-size`
/// counts its growth): the disk quota of one call.
pub const DEFAULT_DISK_BYTES: u64 = 256 << 20;

/// Resources (files, streams, pollables, HTTP fields and requests, …) one
/// invocation may hold at once, on the host's side and as component
/// handles.
pub const DEFAULT_HANDLES: u32 = 4096;

/// The limits one invocation runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallLimits {
    /// Wall-clock time, in milliseconds when serialized.
    #[serde(rename = "timeout_ms", with = "millis")]
    pub timeout: Duration,
    pub memory_bytes: u64,
    /// `None` when the host does not meter fuel.
    pub fuel: Option<u64>,
    pub output_bytes: u64,
    // Records written before these limits existed read as the defaults.
    #[serde(default = "output_nodes")]
    pub output_nodes: u64,
    #[serde(default = "open_files")]
    pub open_files: u32,
    #[serde(default = "disk_bytes")]
    pub disk_bytes: u64,
    #[serde(default = "handles")]
    pub handles: u32,
}

fn output_nodes() -> u64 {
    DEFAULT_OUTPUT_NODES
}

fn open_files() -> u32 {
    DEFAULT_OPEN_FILES
}

fn disk_bytes() -> u64 {
    DEFAULT_DISK_BYTES
}

fn handles() -> u32 {
    DEFAULT_HANDLES
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            timeout: DEFAULT_TIMEOUT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            fuel: Some(DEFAULT_FUEL),
            output_bytes: DEFAULT_OUTPUT_BYTES,
            output_nodes: DEFAULT_OUTPUT_NODES,
            open_files: DEFAULT_OPEN_FILES,
            disk_bytes: DEFAULT_DISK_BYTES,
            handles: DEFAULT_HANDLES,
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

#[cfg(test)]
mod tests {
    use crate::limits::{
        CallLimits, DEFAULT_DISK_BYTES, DEFAULT_FUEL, DEFAULT_MEMORY_BYTES, DEFAULT_OUTPUT_BYTES,
    };

    #[test]
    fn limits_serialize_with_units_in_names() {
        let v = serde_json::to_value(CallLimits::default()).expect("json");
        assert_eq!(v["timeout_ms"], 10_000);
        assert_eq!(v["memory_bytes"], DEFAULT_MEMORY_BYTES);
        assert_eq!(v["disk_bytes"], DEFAULT_DISK_BYTES);
        let back: CallLimits = serde_json::from_value(v).expect("back");
        assert_eq!(back, CallLimits::default());
    }

    #[test]
    fn records_from_before_the_resource_limits_read_as_the_defaults() {
        let old = serde_json::json!({
            "timeout_ms": 10_000,
            "memory_bytes": DEFAULT_MEMORY_BYTES,
            "fuel": DEFAULT_FUEL,
            "output_bytes": DEFAULT_OUTPUT_BYTES,
        });
        let read: CallLimits = serde_json::from_value(old).expect("old record");
        assert_eq!(read, CallLimits::default());
    }
}
