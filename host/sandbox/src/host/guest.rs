//! One guest call: a fresh store from the call's grants and limits, the
//! call under the wall-clock timeout, and how it ended — the specific
//! error for every way a guest can fail (memory, fuel, time, stack, panic,
//! trap, a refused capability).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use wasmtime::{Store, Trap, UpdateDeadline};

use super::PluginHost;
use crate::bindings::{self, Descriptor};
use crate::error::{InvokeError, ToolError};
use crate::limits::{CallLimits, MAX_ERROR_MESSAGE_BYTES, MemoryLimitHit, STDERR_CAPTURE_BYTES};
use crate::policy::Grant;
use crate::record::{Baseline, Captured, HostCall, HostcallRecord, Refusal};
use crate::registry::Pre;
use crate::state::CallState;

/// What a guest call is.
pub(super) enum GuestCall<'a> {
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
pub(super) enum Returned {
    Described(Descriptor),
    Invoked(Result<String, bindings::ToolError>),
    Verified(Result<bindings::Verdict, bindings::ToolError>),
}

/// Everything one guest run leaves for the record.
pub(super) struct GuestRun {
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
fn classify(err: &wasmtime::Error, limits: &CallLimits, stderr: &Captured) -> InvokeError {
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

pub(super) fn tool_error(e: bindings::ToolError) -> ToolError {
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

impl PluginHost {
    /// Runs one guest call in a fresh store under `limits`.
    pub(super) async fn run_guest(
        &self,
        pre: &Pre,
        grants: &[Grant],
        limits: CallLimits,
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
    pub(super) fn fill(
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
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h…");
        assert_eq!(truncate("abc".into(), 5), "abc");
    }
}
