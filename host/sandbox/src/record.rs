//! The hostcall record: what the host writes down about every invocation,
//! and the journal that collects it while the guest runs.
//!
//! A record is produced for every tool and verifier invocation (and for the
//! `describe` call at load), whether it succeeds or fails; the executor
//! stores it in the run's episode, so it serializes. What is recorded, and
//! how:
//!
//! - `wasi:filesystem` — every call individually (interface, function, the
//!   guest path(s) with flags, result), by a wrapper around wasmtime-wasi's
//!   implementation (`fs.rs`). Resource drops are not recorded.
//! - `wasi:http` — every outgoing request individually (method, URL,
//!   allowed or refused, status), at wasmtime-wasi-http's `send_request`
//!   hook (`http.rs`).
//! - Baseline interfaces — aggregated in [`Baseline`]: wall- and
//!   monotonic-clock reads and random words drawn (counted by the host's
//!   deterministic clock and RNG implementations), bytes written to stdout
//!   and stderr (counted by the capture pipes). Environment, stdin and
//!   terminal queries are served empty and not counted.
//!
//! The journal is bounded per invocation, like everything else a guest can
//! make the host hold: the first [`JOURNAL_MAX_ENTRIES`] calls (within
//! [`JOURNAL_MAX_BYTES`], each argument and result cut to
//! [`JOURNAL_MAX_FIELD_BYTES`]) and [`MAX_REFUSALS`] refusals are recorded
//! one by one; the rest are counted per function in [`Omitted`].
//!
//! This module knows nothing of wasmtime; it holds plain data.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::limits::{
    CallLimits, JOURNAL_MAX_BYTES, JOURNAL_MAX_ENTRIES, JOURNAL_MAX_FIELD_BYTES, MAX_REFUSALS,
};
use crate::policy::Grant;

/// The WIT package every record's tool speaks.
pub const WIT_PACKAGE: &str = "poimen:plugin@0.1.0";

/// Which export was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// `invoke` of a tool.
    Tool,
    /// `verify` of a verifier.
    Verifier,
    /// `describe`, called once when the component is loaded.
    Describe,
}

/// Which component ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentIdentity {
    pub name: String,
    pub version: String,
    /// Blake3 of the component bytes, `b3:`-prefixed.
    pub digest: String,
    /// The WIT package the component was linked against.
    pub wit_package: String,
}

/// One capability-bearing host call the guest made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCall {
    /// e.g. `wasi:filesystem/types`.
    pub interface: String,
    /// e.g. `[method]descriptor.open-at`.
    pub function: String,
    /// The arguments that matter, in words: the guest path and flags, the
    /// method and URL.
    pub args: String,
    /// `ok`, `ok: <detail>`, `error: <code>`, or `refused: <why>`.
    pub result: String,
}

/// A capability use the host refused; any refusal fails the invocation with
/// [`InvokeError::CapabilityDenied`](crate::InvokeError::CapabilityDenied),
/// whatever the guest made of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The capability the use would have needed (`http`, `fs-read:/data`).
    pub capability: String,
    /// What was attempted (`GET http://evil.example/`, `open ../x`).
    pub attempted: String,
    pub why: String,
}

/// Baseline imports, aggregated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    pub wall_clock_reads: u64,
    pub monotonic_clock_reads: u64,
    /// 32-bit words drawn from the deterministic random sources.
    pub random_words: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// How the invocation ended, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Ok {
        /// Blake3 of the canonical JSON result, `b3:`-prefixed.
        output_hash: String,
        output_bytes: u64,
    },
    Error {
        /// [`InvokeError::kind`](crate::InvokeError::kind), e.g. `timeout`.
        kind: String,
        message: String,
    },
}

/// What the guest wrote to stdout and stderr, interleaved as written and
/// bounded to [`STDERR_CAPTURE_BYTES`](crate::limits::STDERR_CAPTURE_BYTES):
/// its beginning and its end (where a traceback or panic message is).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// The kept text as UTF-8 (lossy); when bytes were dropped, a line
    /// `[… N bytes not kept …]` marks where.
    pub text: String,
    /// Whether more was written than kept.
    pub truncated: bool,
    /// How many bytes were dropped from the middle.
    #[serde(default)]
    pub omitted_bytes: u64,
}

impl HostcallRecord {
    /// The record as JSON, as runs keep it.
    ///
    /// Cannot fail: the record's maps have string keys and its enums are
    /// plain; should that ever change, the JSON names the problem instead of
    /// silently becoming `null`.
    pub fn to_json(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(v) => v,
            Err(e) => serde_json::json!({"unencodable": e.to_string()}),
        }
    }
}

/// Everything the host knows about one invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostcallRecord {
    pub kind: CallKind,
    /// The reference asked for (`json@^0.1`), or the component's origin for
    /// a `describe` at load.
    pub requested: String,
    /// The component that ran; `None` when none was found.
    pub tool: Option<ComponentIdentity>,
    /// The arguments as canonical JSON (RFC 8785). For a verifier, the
    /// object `{"config", "input", "output"}`.
    pub args: String,
    /// Blake3 of `args`, `b3:`-prefixed.
    pub args_hash: String,
    /// The tool call's idempotency key; `None` for verifiers and `describe`.
    pub idempotency_key: Option<String>,
    /// What the invocation was granted.
    pub capabilities: Vec<Grant>,
    /// The limits it ran under.
    pub limits: CallLimits,
    /// Capability-bearing host calls, in the order they were made.
    pub host_calls: Vec<HostCall>,
    /// Refused capability uses.
    pub refusals: Vec<Refusal>,
    /// Host calls and refusals past the journal's bounds, counted.
    #[serde(default, skip_serializing_if = "Omitted::is_empty")]
    pub omitted: Omitted,
    pub baseline: Baseline,
    pub outcome: Outcome,
    /// Fuel burnt; `None` when the host does not meter fuel or no guest ran.
    pub fuel_consumed: Option<u64>,
    /// The most memory the guest held at once, in bytes: its linear
    /// memories plus what the host kept on its behalf (charged to the same
    /// budget, [`CallLimits::memory_bytes`]). `None` when no guest ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// Wall time from lookup to outcome, in microseconds (volatile).
    pub wall_time_us: u64,
    pub stderr: Captured,
}

/// What the journal counted instead of recording: host calls past
/// [`JOURNAL_MAX_ENTRIES`] or [`JOURNAL_MAX_BYTES`], by `interface
/// function`, and refusals past [`MAX_REFUSALS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Omitted {
    /// Host calls counted, not recorded.
    pub host_calls: u64,
    /// The same, per `interface function` (a few dozen keys at most).
    pub by_function: BTreeMap<String, u64>,
    /// Refusals counted, not recorded.
    pub refusals: u64,
}

impl Omitted {
    /// Nothing was left out.
    pub fn is_empty(&self) -> bool {
        self.host_calls == 0 && self.refusals == 0
    }
}

/// `s` cut to at most `max` bytes on a character boundary, marked `…`
/// where it was cut.
pub(crate) fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Blake3 of `bytes`, `b3:`-prefixed lowercase hex.
pub fn b3(bytes: &[u8]) -> String {
    format!("b3:{}", blake3::hash(bytes).to_hex())
}

/// Host calls and refusals of one invocation, shared by the pieces that
/// see them (the filesystem wrapper, the HTTP hook and its response future).
/// Bounded: see the module's documentation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Journal(Arc<Mutex<JournalInner>>);

#[derive(Debug, Default)]
pub(crate) struct JournalInner {
    pub calls: Vec<HostCall>,
    pub refusals: Vec<Refusal>,
    pub omitted: Omitted,
    /// Bytes of argument and result text recorded so far.
    bytes: usize,
}

/// The index of a call that was counted, not recorded: its result is not
/// kept either.
const NOT_RECORDED: usize = usize::MAX;

impl Journal {
    fn with<R>(&self, f: impl FnOnce(&mut JournalInner) -> R) -> R {
        // A panic while holding the lock cannot leave a half-written entry
        // that matters: keep recording.
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Appends a call; returns its index, to fill in the result later.
    pub fn call(&self, interface: &str, function: &str, args: String, result: String) -> usize {
        self.with(|j| {
            let args = cut(args, JOURNAL_MAX_FIELD_BYTES);
            let result = cut(result, JOURNAL_MAX_FIELD_BYTES);
            let size = args.len() + result.len();
            if j.calls.len() >= JOURNAL_MAX_ENTRIES || j.bytes + size > JOURNAL_MAX_BYTES {
                j.omitted.host_calls += 1;
                *j.omitted
                    .by_function
                    .entry(format!("{interface} {function}"))
                    .or_default() += 1;
                return NOT_RECORDED;
            }
            j.bytes += size;
            j.calls.push(HostCall {
                interface: interface.to_owned(),
                function: function.to_owned(),
                args,
                result,
            });
            j.calls.len() - 1
        })
    }

    pub fn set_result(&self, index: usize, result: String) {
        self.with(|j| {
            if let Some(c) = j.calls.get_mut(index) {
                let result = cut(result, JOURNAL_MAX_FIELD_BYTES);
                j.bytes = (j.bytes + result.len()).saturating_sub(c.result.len());
                c.result = result;
            }
        });
    }

    pub fn refuse(&self, mut refusal: Refusal) {
        self.with(|j| {
            if j.refusals.len() >= MAX_REFUSALS {
                j.omitted.refusals += 1;
                return;
            }
            refusal.attempted = cut(refusal.attempted, JOURNAL_MAX_FIELD_BYTES);
            j.refusals.push(refusal);
        });
    }

    pub fn take(&self) -> (Vec<HostCall>, Vec<Refusal>, Omitted) {
        self.with(|j| {
            j.bytes = 0;
            (
                std::mem::take(&mut j.calls),
                std::mem::take(&mut j.refusals),
                std::mem::take(&mut j.omitted),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_fills_results_in_later() {
        let j = Journal::default();
        let i = j.call(
            "wasi:http/outgoing-handler",
            "handle",
            "GET http://a/".into(),
            "pending".into(),
        );
        j.set_result(i, "ok: 200".into());
        j.refuse(Refusal {
            capability: "http".into(),
            attempted: "GET http://b/".into(),
            why: "not allowed".into(),
        });
        let (calls, refusals, omitted) = j.take();
        assert_eq!(calls[0].result, "ok: 200");
        assert_eq!(refusals.len(), 1);
        assert!(omitted.is_empty());
        assert_eq!(j.take().1.len(), 0, "taken");
    }

    #[test]
    fn the_journal_is_bounded_and_counts_what_it_leaves_out() {
        let j = Journal::default();
        for i in 0..JOURNAL_MAX_ENTRIES + 10 {
            let index = j.call(
                "wasi:filesystem/types",
                "stat",
                format!("/scratch/{i}"),
                "ok".into(),
            );
            j.set_result(index, "ok: again".into());
        }
        // One argument the size of a long path is cut.
        j.call(
            "wasi:filesystem/types",
            "open-at",
            "x".repeat(1 << 20),
            String::new(),
        );
        for _ in 0..MAX_REFUSALS + 3 {
            j.refuse(Refusal {
                capability: "http".into(),
                attempted: "y".repeat(1 << 20),
                why: "no".into(),
            });
        }
        let (calls, refusals, omitted) = j.take();
        assert_eq!(calls.len(), JOURNAL_MAX_ENTRIES);
        assert_eq!(omitted.host_calls, 11);
        assert_eq!(omitted.by_function["wasi:filesystem/types stat"], 10);
        assert_eq!(omitted.by_function["wasi:filesystem/types open-at"], 1);
        assert_eq!(refusals.len(), MAX_REFUSALS);
        assert_eq!(omitted.refusals, 3);
        assert!(refusals[0].attempted.len() <= JOURNAL_MAX_FIELD_BYTES + '…'.len_utf8());
        let kept: usize = calls.iter().map(|c| c.args.len() + c.result.len()).sum();
        assert!(kept <= JOURNAL_MAX_BYTES, "{kept}");

        // Bytes bound too: long arguments fill it before the entry count.
        let j = Journal::default();
        for _ in 0..JOURNAL_MAX_ENTRIES {
            j.call("i", "f", "z".repeat(4096), String::new());
        }
        let (calls, _, omitted) = j.take();
        assert!(calls.len() < JOURNAL_MAX_ENTRIES);
        assert_eq!(
            calls.len() as u64 + omitted.host_calls,
            JOURNAL_MAX_ENTRIES as u64
        );
    }

    #[test]
    fn outcome_serializes_with_a_status_tag() {
        let v = serde_json::to_value(Outcome::Error {
            kind: "timeout".into(),
            message: "m".into(),
        })
        .expect("json");
        assert_eq!(
            v,
            serde_json::json!({"status": "error", "kind": "timeout", "message": "m"})
        );
        assert_eq!(b3(b"").len(), 3 + 64);
    }
}
