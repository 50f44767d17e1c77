//! The host's step scheduler: a bounded number of step executions at once
//! (tool and model attempts; waits, fan-outs and child runs take none), the
//! ready ones granted by priority with aging, and the pressure that decides
//! which new runs this host admits.
//!
//! **Order.** A ready step waits for a worker when all are busy. A freed
//! worker goes to the waiting step of highest *effective* priority, the
//! oldest first among equals. Each time a step is overtaken — a step that
//! became ready after it is granted first — it counts a pass; every
//! [`AGING_PASSES`] passes raise its effective priority one level (`low` →
//! `normal` → `high`). So a step is overtaken by at most
//! [`MAX_OVERTAKEN`] (`2 × AGING_PASSES`) later steps, whatever keeps
//! arriving: `low` work is never starved. Priority is a tiebreak under
//! scarcity, not a reservation: with a worker free, any step runs at once.
//!
//! **Pressure.** From the queue's depth: `ok` below
//! [`SchedulerConfig::warn_queue`] waiting steps, `warn` from it, `shed`
//! from [`SchedulerConfig::shed_queue`]. At `warn` new `low` runs are
//! refused, at `shed` new `normal` runs too; `high` runs are never refused.
//! A refusal is a typed, retryable [`StartError::Shed`](crate::StartError)
//! naming the level, logged, and counted in [`SchedulerStats`].
//!
//! Nothing here reaches recorded state: which step runs first changes only
//! when things happen, which the episode already records as it happens.

use std::sync::{Arc, Mutex, MutexGuard};

use poimen_workflow::Priority;
use serde::Serialize;
use tokio::sync::oneshot;

/// Passes (times overtaken) that raise a waiting step's effective
/// priority by one level.
pub const AGING_PASSES: u32 = 8;

/// The most later-ready steps a waiting step can be overtaken by: after
/// this many it ranks with `high` and, being older, goes before every step
/// that arrives after it.
pub const MAX_OVERTAKEN: u32 = 2 * AGING_PASSES;

/// How many step executions a host runs at once, and the queue depths at
/// which it sheds new runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Step executions at once (at least 1).
    pub workers: usize,
    /// Waiting steps from which the pressure is `warn`.
    pub warn_queue: usize,
    /// Waiting steps from which the pressure is `shed`.
    pub shed_queue: usize,
}

impl SchedulerConfig {
    /// `workers` at once; `warn` from 4 waiting steps per worker, `shed`
    /// from 16 per worker.
    pub fn workers(workers: usize) -> SchedulerConfig {
        let workers = workers.max(1);
        SchedulerConfig {
            workers,
            warn_queue: workers.saturating_mul(4),
            shed_queue: workers.saturating_mul(16),
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::workers(8)
    }
}

/// How loaded a host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pressure {
    Ok,
    Warn,
    Shed,
}

impl std::fmt::Display for Pressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Pressure::Ok => "ok",
            Pressure::Warn => "warn",
            Pressure::Shed => "shed",
        })
    }
}

/// What the scheduler has done, and its state now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerStats {
    pub workers: usize,
    /// Step executions running now.
    pub running: usize,
    /// Steps waiting for a worker now.
    pub queued: usize,
    pub pressure: Option<Pressure>,
    /// Workers granted since the host started.
    pub granted: u64,
    /// New runs refused, by priority.
    pub shed_low: u64,
    pub shed_normal: u64,
    /// The most times one step was overtaken (at most [`MAX_OVERTAKEN`]).
    pub max_overtaken: u32,
}

/// A new run refused under pressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub level: Pressure,
    pub queued: usize,
    pub workers: usize,
}

struct Waiter {
    seq: u64,
    rank: u32,
    passes: u32,
    grant: oneshot::Sender<()>,
}

impl Waiter {
    fn effective(&self) -> u32 {
        (self.rank + self.passes / AGING_PASSES).min(rank(Priority::High))
    }
}

#[derive(Default)]
struct State {
    running: usize,
    next_seq: u64,
    waiting: Vec<Waiter>,
    granted: u64,
    shed_low: u64,
    shed_normal: u64,
    max_overtaken: u32,
}

fn rank(p: Priority) -> u32 {
    match p {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
    }
}

/// The scheduler one host's runs share.
pub(crate) struct Scheduler {
    config: SchedulerConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A worker, held while a step executes; dropping it frees the worker for
/// the next waiting step.
pub(crate) struct Permit {
    sched: Arc<Scheduler>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.sched.release();
    }
}

/// A step waiting for a worker. Dropped before it is granted (its run was
/// cancelled or interrupted), it leaves the queue; dropped just after, it
/// gives the worker back.
struct Pending {
    sched: Arc<Scheduler>,
    seq: u64,
    grant: Option<oneshot::Receiver<()>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut rx) = self.grant.take() else {
            return;
        };
        let mut st = self.sched.lock();
        if let Some(i) = st.waiting.iter().position(|w| w.seq == self.seq) {
            st.waiting.remove(i);
            return;
        }
        drop(st);
        if rx.try_recv().is_ok() {
            self.sched.release();
        }
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Scheduler {
        Scheduler {
            config: SchedulerConfig {
                workers: config.workers.max(1),
                ..config
            },
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pressure_of(&self, st: &State) -> Pressure {
        let q = st.waiting.len();
        if q >= self.config.shed_queue {
            Pressure::Shed
        } else if q >= self.config.warn_queue {
            Pressure::Warn
        } else {
            Pressure::Ok
        }
    }

    /// The pressure now.
    pub fn pressure(&self) -> Pressure {
        self.pressure_of(&self.lock())
    }

    /// Whether a new run of `priority` is admitted now; a refusal is
    /// counted.
    pub fn admit(&self, priority: Priority) -> Result<(), Refusal> {
        let mut st = self.lock();
        let level = self.pressure_of(&st);
        let refused = match priority {
            Priority::Low => level >= Pressure::Warn,
            Priority::Normal => level >= Pressure::Shed,
            Priority::High => false,
        };
        if !refused {
            return Ok(());
        }
        match priority {
            Priority::Low => st.shed_low += 1,
            _ => st.shed_normal += 1,
        }
        Err(Refusal {
            level,
            queued: st.waiting.len(),
            workers: self.config.workers,
        })
    }

    /// Waits for a worker for a step of a run of `priority`.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        let (seq, rx) = {
            let mut st = self.lock();
            if st.running < self.config.workers && st.waiting.is_empty() {
                st.running += 1;
                st.granted += 1;
                return Permit {
                    sched: self.clone(),
                };
            }
            let (tx, rx) = oneshot::channel();
            let seq = st.next_seq;
            st.next_seq += 1;
            st.waiting.push(Waiter {
                seq,
                rank: rank(priority),
                passes: 0,
                grant: tx,
            });
            (seq, rx)
        };
        let mut pending = Pending {
            sched: self.clone(),
            seq,
            grant: Some(rx),
        };
        if let Some(rx) = pending.grant.as_mut() {
            // The sender lives in the queue until it grants; it is dropped
            // only by granting, so an error cannot happen — and would mean
            // the worker is ours anyway.
            let _ = rx.await;
        }
        pending.grant = None;
        Permit {
            sched: self.clone(),
        }
    }

    /// Frees a worker: the best waiting step gets it.
    fn release(&self) {
        let mut st = self.lock();
        loop {
            let best = st
                .waiting
                .iter()
                .enumerate()
                .max_by_key(|(_, w)| (w.effective(), std::cmp::Reverse(w.seq)))
                .map(|(i, w)| (i, w.seq));
            let Some((i, seq)) = best else {
                st.running = st.running.saturating_sub(1);
                return;
            };
            let w = st.waiting.remove(i);
            // Every older step it goes before is overtaken once more.
            let mut most = st.max_overtaken;
            for other in st.waiting.iter_mut().filter(|o| o.seq < seq) {
                other.passes += 1;
                most = most.max(other.passes);
            }
            st.max_overtaken = most;
            if w.grant.send(()).is_ok() {
                // The worker passes on: `running` is unchanged.
                st.granted += 1;
                return;
            }
            // Its waiter is gone: the next one.
        }
    }

    /// Counts and state now.
    pub fn stats(&self) -> SchedulerStats {
        let st = self.lock();
        SchedulerStats {
            workers: self.config.workers,
            running: st.running,
            queued: st.waiting.len(),
            pressure: Some(self.pressure_of(&st)),
            granted: st.granted,
            shed_low: st.shed_low,
            shed_normal: st.shed_normal,
            max_overtaken: st.max_overtaken,
        }
    }
}
