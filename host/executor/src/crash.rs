//! Crash injection points for the crash-matrix tests.
//!
//! Compiled in only with the `crash-points` feature (which only test builds
//! enable) and armed only by the `POIMEN_CRASH_AT` environment variable
//! (`after_dispatched`, or `after_dispatched:2` for the second time the point
//! is reached). When armed and reached, the process announces it on stderr
//! and stops making progress so the test harness can kill it with SIGKILL
//! at exactly that point. In a normal build [`crash_point`] is an empty
//! inline function.

/// Names of the injection points, in the order a tool step reaches them.
pub const CRASH_POINTS: &[&str] = &[
    "before_pending",
    "after_pending",
    "after_dispatched",
    "before_committed",
    "after_committed",
    "before_judgment",
    "waiting_judgment",
    "after_model_requested",
    "before_model_committed",
    "after_model_committed",
    "after_child_requested",
    "after_child_created",
    "with_unwritten_tail",
    // The HTTP API's one-request start: the run stopped (durably), its
    // answer not yet sent.
    "before_answer",
];

/// Marks an injection point.
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn crash_point(_name: &str) {}

/// Marks an injection point.
#[cfg(feature = "crash-points")]
pub fn crash_point(name: &str) {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    static ARMED: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static HITS: AtomicU32 = AtomicU32::new(0);
    let armed = ARMED.get_or_init(|| {
        let spec = std::env::var("POIMEN_CRASH_AT").ok()?;
        match spec.split_once(':') {
            Some((point, n)) => Some((point.to_owned(), n.parse().unwrap_or(1))),
            None => Some((spec, 1)),
        }
    });
    let Some((point, nth)) = armed else { return };
    if point != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "poimen: crash point `{name}` reached");
    let _ = err.flush();
    // Hold here until the harness kills the process.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
