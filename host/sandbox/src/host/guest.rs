//! One guest call: a fresh store from the call's grants and limits, the
//! call under the wall-clock timeout, and how it ended — the specific
//! error for every way a guest can fail (memory, fuel, time, stack, panic,
//! trap, a refused capability).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use wasmtime::{Store, Trap, UpdateDeadline};

use super::PluginHost;
use crate::bindings::{self, Descriptor};
use crate::error::{GuestLanguage, InvokeError, ToolError};
use crate::limits::{
    CallLimits, LimitHit, MAX_ERROR_MESSAGE_BYTES, MAX_HOSTCALL_BYTES, MemoryLimitHit, Resource,
    STDERR_CAPTURE_BYTES,
};
use crate::policy::Grant;
use crate::record::{Baseline, Captured, HostCall, HostcallRecord, Omitted, Refusal};
use crate::registry::Pre;
use crate::state::CallState;

/// What a guest call is.
#[derive(Clone, Copy)]
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
    memory_peak_bytes: Option<u64>,
    host_calls: Vec<HostCall>,
    refusals: Vec<Refusal>,
    omitted: Omitted,
    baseline: Baseline,
    stderr: Captured,
}

/// Decrements the in-flight count when an invocation ends or is dropped,
/// and wakes calls waiting for room in the instance pool (its store, and
/// so its instances, are gone by then).
struct InFlight<'a>(&'a AtomicUsize, &'a tokio::sync::Notify);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        self.1.notify_waiters();
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

/// The last uncaught Python exception in a guest's output: the exception
/// line (`ValueError: why`) and where it was raised (the innermost
/// `File "…", line N, in f`).
fn python_exception(stderr: &str) -> Option<String> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let lines: Vec<&str> = stderr[start..].lines().skip(1).collect();
    let mut location = None;
    let mut exception = Vec::new();
    for line in &lines {
        if line.trim().is_empty() {
            // The exception ends at a blank line (what follows is the
            // runtime's own report).
            if !exception.is_empty() {
                break;
            }
        } else if let Some(frame) = line.trim_start().strip_prefix("File ") {
            location = Some(frame.trim().to_owned());
            exception.clear();
        } else if !line.starts_with(' ') || !exception.is_empty() {
            exception.push(line.trim_end());
        }
    }
    let exception = exception.join("\n");
    if exception.is_empty() {
        return None;
    }
    Some(match location {
        Some(at) => format!("{exception} (at {at})"),
        None => exception,
    })
}

/// An uncaught JavaScript error in a guest's output (componentize-js /
/// StarlingMonkey): `Error: why` and the innermost stack frame.
fn javascript_error(stderr: &str) -> Option<String> {
    const NAMES: [&str; 7] = [
        "Error",
        "TypeError",
        "RangeError",
        "ReferenceError",
        "SyntaxError",
        "URIError",
        "EvalError",
    ];
    // A value thrown where the bindings expected a WIT error (`{ tag, val
    // }`): they print what was thrown, then abort.
    for line in stderr.lines().rev() {
        if let Some((_, rest)) = line.split_once("(received `")
            && let Some((thrown, ty)) = rest.split_once("`) specified for `")
        {
            let ty = ty.split('`').next().unwrap_or("the error type");
            return Some(format!(
                "{thrown} (thrown from an export whose error type is `{ty}`; to return that error, throw {{ tag: \"failed\", val: \"why\" }})"
            ));
        }
    }
    let lines: Vec<&str> = stderr.lines().collect();
    let (at, line) = lines.iter().enumerate().rev().find_map(|(i, l)| {
        let l = l.trim_start();
        let l = l.strip_prefix("Uncaught ").unwrap_or(l);
        let l = l.strip_prefix("Error while running call: ").unwrap_or(l);
        NAMES
            .iter()
            .any(|n| l.strip_prefix(n).is_some_and(|rest| rest.starts_with(':')))
            .then_some((i, l))
    })?;
    let frame = lines[at + 1..]
        .iter()
        .map(|l| l.trim())
        .find(|l| l.contains('@') && l.contains(':'));
    Some(match frame {
        Some(f) => format!("{line} (at {f})"),
        None => line.to_owned(),
    })
}

/// The guest's own failure in its language's terms, if its output shows one.
///
/// Python and JavaScript first: their runtimes are Rust and C++, and
/// componentize-py's panics after printing the traceback.
fn guest_failure(stderr: &str) -> Option<(GuestLanguage, String)> {
    if let Some(m) = python_exception(stderr) {
        return Some((GuestLanguage::Python, m));
    }
    if let Some(m) = javascript_error(stderr) {
        return Some((GuestLanguage::JavaScript, m));
    }
    panic_message(stderr).map(|m| (GuestLanguage::Rust, m))
}

/// A trap: the guest's failure if its output shows one, else the trap.
fn trapped(trap: String, stderr: &Captured) -> InvokeError {
    match guest_failure(&stderr.text) {
        Some((language, message)) => InvokeError::GuestPanicked {
            language,
            message,
            stderr: stderr.text.clone(),
        },
        None => InvokeError::Trap {
            trap,
            stderr: stderr.text.clone(),
        },
    }
}

/// Turns a wasmtime error from a guest call into the specific error.
fn classify(err: &wasmtime::Error, limits: &CallLimits, stderr: &Captured) -> InvokeError {
    if let Some(hit) = err.downcast_ref::<MemoryLimitHit>() {
        return InvokeError::MemoryExhausted {
            limit_bytes: hit.limit,
            requested_bytes: hit.requested,
        };
    }
    if let Some(hit) = err.downcast_ref::<LimitHit>() {
        return InvokeError::ResourceExhausted {
            resource: hit.resource,
            limit: hit.limit,
        };
    }
    if let Some(resource) = exhausted_by_wasmtime(err) {
        let limit = match resource {
            Resource::Handles => u64::from(limits.handles),
            _ => MAX_HOSTCALL_BYTES as u64,
        };
        return InvokeError::ResourceExhausted { resource, limit };
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
            t => trapped(t.to_string(), stderr),
        };
    }
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return trapped(format!("the guest called exit({})", exit.0), stderr);
    }
    trapped(format!("{err:#}"), stderr)
}

/// The limits wasmtime itself enforces for the host (its resource table,
/// the store's component handles, hostcall fuel), by their errors. The
/// types of the last two are private to wasmtime: their messages are what
/// it offers.
fn exhausted_by_wasmtime(err: &wasmtime::Error) -> Option<Resource> {
    if matches!(
        err.downcast_ref::<wasmtime::component::ResourceTableError>(),
        Some(wasmtime::component::ResourceTableError::Full)
    ) {
        return Some(Resource::Handles);
    }
    let text = format!("{err:#}");
    if text.contains("resource table has no free keys") || text.contains("store handle limit") {
        Some(Resource::Handles)
    } else if text.contains("fuel allocated for hostcalls has been exhausted") {
        Some(Resource::HostcallBytes)
    } else {
        None
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
    ///
    /// Should the instance pool have no room for this component's core
    /// instances, memories or tables (a language runtime needs several of
    /// each), the call waits for another call to end and tries again in a
    /// fresh store, within its own timeout: a full pool delays a call, it
    /// never fails it.
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
            memory_peak_bytes: None,
            host_calls: Vec::new(),
            refusals: Vec::new(),
            omitted: Omitted::default(),
            baseline: Baseline::default(),
            stderr: Captured::default(),
        };
        let Ok(_permit) = self.inner.slots.acquire().await else {
            return failed(InvokeError::Host("the host is shutting down".into()));
        };
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight(&self.inner.in_flight, &self.inner.released);
        let deadline = tokio::time::Instant::now() + limits.timeout;
        loop {
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let mut store = match self.store(grants, limits, seed) {
                Ok(s) => s,
                Err(e) => return failed(e),
            };
            let timed =
                tokio::time::timeout_at(deadline, Self::attempt(&mut store, pre, call)).await;
            if let Ok(Err((true, e))) = &timed
                && e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
                    .is_some()
            {
                // The store's partial instances go back to the pool first.
                drop(store);
                if tokio::time::timeout_at(deadline, released).await.is_err() {
                    return failed(InvokeError::Timeout {
                        limit: limits.timeout,
                    });
                }
                continue;
            }
            return Self::ended(&store, timed.map_err(|_| ()), limits);
        }
    }

    /// A fresh store for one attempt at a call.
    fn store(
        &self,
        grants: &[Grant],
        limits: CallLimits,
        seed: &[u8; 32],
    ) -> Result<Store<CallState>, InvokeError> {
        let state = CallState::new(
            grants,
            seed,
            &limits,
            STDERR_CAPTURE_BYTES,
            Some(&self.inner.scratch),
        )
        .map_err(InvokeError::Host)?;
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the guest can make the host allocate outside its memory:
        // handles in the store's tables, and bytes per host call. The result
        // of the call itself is not a host call: it is bounded by the
        // guest's memory and then by `output_bytes`, with its own error; so
        // the byte bound holds only while the guest runs.
        store.set_max_component_handles(usize::try_from(limits.handles).unwrap_or(usize::MAX));
        store.set_hostcall_fuel(usize::MAX);
        store.call_hook(|mut cx, hook| {
            let depth = &mut cx.data_mut().wasm_depth;
            match hook {
                wasmtime::CallHook::CallingWasm => {
                    *depth += 1;
                    if *depth == 1 {
                        cx.set_hostcall_fuel(MAX_HOSTCALL_BYTES);
                    }
                }
                wasmtime::CallHook::ReturningFromWasm => {
                    *depth = depth.saturating_sub(1);
                    if *depth == 0 {
                        cx.set_hostcall_fuel(usize::MAX);
                    }
                }
                _ => {}
            }
            Ok(())
        });
        if let Some(fuel) = limits.fuel {
            store
                .set_fuel(fuel)
                .map_err(|e| InvokeError::Host(format!("cannot set fuel: {e:#}")))?;
        }
        // Every tick, yield to the executor: the timeout's timer can fire
        // and a dropped future stops the guest.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|_| Ok(UpdateDeadline::Yield(1)));
        Ok(store)
    }

    /// Instantiates and calls; the error says whether it came while
    /// instantiating.
    async fn attempt(
        store: &mut Store<CallState>,
        pre: &Pre,
        call: GuestCall<'_>,
    ) -> Result<Returned, (bool, wasmtime::Error)> {
        match (pre, call) {
            (Pre::Tool(p), GuestCall::Describe) => {
                let i = p
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(|e| (true, e))?;
                i.call_describe(&mut *store)
                    .await
                    .map(Returned::Described)
                    .map_err(|e| (false, e))
            }
            (Pre::Tool(p), GuestCall::Invoke { args, key }) => {
                let i = p
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(|e| (true, e))?;
                i.call_invoke(&mut *store, args, key)
                    .await
                    .map(Returned::Invoked)
                    .map_err(|e| (false, e))
            }
            (Pre::Verifier(p), GuestCall::Describe) => {
                let i = p
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(|e| (true, e))?;
                i.call_describe(&mut *store)
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
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(|e| (true, e))?;
                i.call_verify(&mut *store, input, output, config)
                    .await
                    .map(Returned::Verified)
                    .map_err(|e| (false, e))
            }
            _ => Err((
                true,
                wasmtime::Error::msg("this component does not export that function"),
            )),
        }
    }

    /// What an attempt left: `Err(())` when the timeout cut it short.
    fn ended(
        store: &Store<CallState>,
        timed: Result<Result<Returned, (bool, wasmtime::Error)>, ()>,
        limits: CallLimits,
    ) -> GuestRun {
        let fuel_consumed = limits
            .fuel
            .map(|f| f.saturating_sub(store.get_fuel().unwrap_or(f)));
        let data = store.data();
        let memory_peak_bytes = Some(data.limiter.peak());
        let stderr = data.stderr();
        let baseline = data.baseline();
        let (host_calls, refusals, omitted) = data.journal.take();
        let result = match timed {
            Err(()) => Err(InvokeError::Timeout {
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
            memory_peak_bytes,
            host_calls,
            refusals,
            omitted,
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
        record.memory_peak_bytes = run.memory_peak_bytes;
        record.host_calls = run.host_calls;
        record.omitted = run.omitted;
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
    fn python_tracebacks_are_recognised() {
        let stderr = "counting the words of 3 characters\nTraceback (most recent call last):\n  File \"/app/app.py\", line 58, in invoke\n    raise ValueError(f\"asked to fail on {text!r}\")\nValueError: asked to fail on 'a b'\n";
        assert_eq!(
            guest_failure(stderr),
            Some((
                GuestLanguage::Python,
                "ValueError: asked to fail on 'a b' (at \"/app/app.py\", line 58, in invoke)"
                    .into()
            ))
        );
        // Chained: the last traceback is the one that escaped.
        let chained = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3, in f\nRuntimeError: boom\n";
        assert_eq!(
            python_exception(chained).as_deref(),
            Some("RuntimeError: boom (at \"a.py\", line 3, in f)")
        );
        assert_eq!(guest_failure("plain output\n"), None);
    }

    #[test]
    fn javascript_errors_are_recognised() {
        let stderr = "counting\nError: asked to fail on \"a\"\ninvoke@word-count.js:45:11\n";
        assert_eq!(
            guest_failure(stderr),
            Some((
                GuestLanguage::JavaScript,
                "Error: asked to fail on \"a\" (at invoke@word-count.js:45:11)".into()
            ))
        );
        assert_eq!(
            javascript_error("TypeError: x is undefined\n").as_deref(),
            Some("TypeError: x is undefined")
        );
        assert_eq!(javascript_error("Errors: none\n"), None);
        // What componentize-js prints for an Error thrown from an export
        // returning `result<_, tool-error>`.
        let thrown = "counting\ninvalid variant tag value `undefined` (received `Error: asked to fail on \"a b\"`) specified for `ToolError`\nStack:\n  export_invoke@/tmp/x/initializer.js:228:17\n\nRedirecting call to abort() to mozalloc_abort\n";
        let (language, message) = guest_failure(thrown).expect("recognised");
        assert_eq!(language, GuestLanguage::JavaScript);
        assert!(
            message.starts_with("Error: asked to fail on \"a b\" (thrown from an export whose error type is `ToolError`"),
            "{message}"
        );
        // A Rust runtime's panic after a Python traceback is the Python's.
        let py = "Traceback (most recent call last):\n  File \"/0/app.py\", line 56, in invoke\nValueError: no\n\nthread '<unnamed>' panicked at runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\n";
        assert_eq!(
            guest_failure(py),
            Some((
                GuestLanguage::Python,
                "ValueError: no (at \"/0/app.py\", line 56, in invoke)".into()
            ))
        );
    }

    #[test]
    fn truncation_keeps_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h…");
        assert_eq!(truncate("abc".into(), 5), "abc");
    }
}
