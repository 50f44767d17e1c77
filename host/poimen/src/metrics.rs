//! Prometheus metrics of a host: runs by how they ended, step and
//! guest-call latency, fuel and memory per call, store commit latency, lease claims
//! and takeovers, and — read when scraped — the scheduler's queue depth and
//! pressure level. [`Host::metrics_text`](crate::Host::metrics_text) renders
//! them in the Prometheus text format (OpenMetrics), for `/metrics`.
//!
//! Everything is observed where the store is written (`events.rs`'s
//! `Observed`): what a commit carries — a step's start and finish with
//! their times, a tool call's hostcall record, a run's new status — and how
//! long it took. Nothing here is read back by a run: metrics never reach
//! what is hashed or replayed. Ephemeral runs (kept in memory) are counted
//! too: their store is observed the same way.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use poimen_store::{Commit, Lease, RunId};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Deserialize;

/// Steps started whose finish has not been seen, at most this many kept
/// (a step whose host died is never finished here).
const OPEN_STEPS_CAP: usize = 100_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    kind: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabel {
    level: String,
}

/// A step execution: (run, step, iteration).
type OpenStep = (RunId, String, u64);

/// What the metrics take of one commit.
#[derive(Debug)]
pub(crate) struct Seen {
    run: RunId,
    ended: Option<&'static str>,
    events: Vec<SeenEvent>,
}

#[derive(Debug)]
enum SeenEvent {
    StepStarted {
        step: String,
        iteration: u64,
        at: i64,
        kind: String,
    },
    StepFinished {
        step: String,
        iteration: u64,
        at: i64,
        status: String,
    },
    ToolCalled {
        tool: String,
        wall_us: Option<u64>,
        fuel: Option<u64>,
        memory: Option<u64>,
    },
}

/// The fields of an event body the metrics read, parsed from its text:
/// strings borrowed where no escape forces a copy, every other field
/// (arguments, outputs, receipts) skipped without being built.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Peek<'a> {
    #[serde(borrow)]
    step: Option<Cow<'a, str>>,
    iteration: u64,
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool: Option<PeekTool<'a>>,
    record: Option<PeekRecord>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PeekTool<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
}

/// What a guest call's record says of its cost.
#[derive(Deserialize, Default)]
#[serde(default)]
struct PeekRecord {
    wall_time_us: Option<u64>,
    fuel_consumed: Option<u64>,
    memory_peak_bytes: Option<u64>,
}

/// The host's metrics.
pub(crate) struct Metrics {
    /// `false`: nothing is observed (`HostBuilder::metrics(false)`).
    on: bool,
    registry: Registry,
    runs_created: Counter,
    runs_ended: Family<StatusLabel, Counter>,
    steps: Family<StepLabel, Histogram>,
    guest_calls: Family<ToolLabel, Histogram>,
    guest_fuel: Family<ToolLabel, Histogram>,
    guest_memory: Family<ToolLabel, Histogram>,
    commits: Histogram,
    commit_errors: Counter,
    claims: Counter,
    takeovers: Counter,
    queued: Gauge,
    running: Gauge,
    workers: Gauge,
    pressure: Family<LevelLabel, Gauge>,
    shed: Family<PriorityLabel, Counter>,
    /// The scheduler's shed counts (low, normal) at the last render.
    shed_seen: Mutex<(u64, u64)>,
    /// (run, step, iteration) → (start ms, kind).
    open_steps: Mutex<HashMap<OpenStep, (i64, String)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 50 µs … ~13 min.
    exponential_buckets(0.000_05, 4.0, 13)
}

impl Metrics {
    pub fn new(on: bool) -> Metrics {
        let mut registry = Registry::with_prefix("poimen");
        let runs_created = Counter::default();
        registry.register(
            "runs_created",
            "Runs created in the store (started, queued or as a child)",
            runs_created.clone(),
        );
        let runs_ended = Family::<StatusLabel, Counter>::default();
        registry.register(
            "runs_ended",
            "Runs that reached a terminal status, by status",
            runs_ended.clone(),
        );
        let steps = Family::<StepLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        registry.register(
            "step_duration_seconds",
            "Step executions from start to finish, by step kind and how they ended",
            steps.clone(),
        );
        let guest_calls = Family::<ToolLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(seconds_buckets())
        });
        registry.register(
            "guest_call_duration_seconds",
            "Tool calls into the sandbox, wall time, by tool",
            guest_calls.clone(),
        );
        let guest_fuel = Family::<ToolLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1_000.0, 10.0, 9))
        });
        registry.register(
            "guest_call_fuel",
            "Fuel (roughly, WebAssembly instructions) a tool call consumed, by tool",
            guest_fuel.clone(),
        );
        let guest_memory = Family::<ToolLabel, Histogram>::new_with_constructor(|| {
            // 64 KiB (one WebAssembly page) … 1 GiB.
            Histogram::new(exponential_buckets(65_536.0, 4.0, 8))
        });
        registry.register(
            "guest_call_memory_bytes",
            "The most memory a tool call held at once (linear memory and what the host kept for it), by tool",
            guest_memory.clone(),
        );
        let commits = Histogram::new(seconds_buckets());
        registry.register(
            "store_commit_duration_seconds",
            "Store commits (one transaction each), wall time",
            commits.clone(),
        );
        let commit_errors = Counter::default();
        registry.register(
            "store_commit_errors",
            "Store commits refused or failed",
            commit_errors.clone(),
        );
        let claims = Counter::default();
        registry.register("lease_claims", "Runs claimed by this host", claims.clone());
        let takeovers = Counter::default();
        registry.register(
            "lease_takeovers",
            "Claims of runs another tenure had held (epoch above 1): a takeover after a lease expired, or a reclaim",
            takeovers.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "scheduler_queued",
            "Step executions waiting for a worker",
            queued.clone(),
        );
        let running = Gauge::default();
        registry.register(
            "scheduler_running",
            "Step executions holding a worker",
            running.clone(),
        );
        let workers = Gauge::default();
        registry.register(
            "scheduler_workers",
            "Concurrent step executions this host allows",
            workers.clone(),
        );
        let pressure = Family::<LevelLabel, Gauge>::default();
        registry.register(
            "pressure",
            "The host's pressure level: 1 for the current level (ok, warn, shed), 0 for the others",
            pressure.clone(),
        );
        let shed = Family::<PriorityLabel, Counter>::default();
        registry.register(
            "runs_shed",
            "New runs refused under pressure, by priority (a typed, retryable error)",
            shed.clone(),
        );
        Metrics {
            on,
            registry,
            shed,
            shed_seen: Mutex::new((0, 0)),
            runs_created,
            runs_ended,
            steps,
            guest_calls,
            guest_fuel,
            guest_memory,
            commits,
            commit_errors,
            claims,
            takeovers,
            queued,
            running,
            workers,
            pressure,
            open_steps: Mutex::new(HashMap::new()),
        }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    pub fn run_created(&self) {
        if !self.on {
            return;
        }
        self.runs_created.inc();
    }

    pub fn claimed(&self, lease: &Lease) {
        if !self.on {
            return;
        }
        self.claims.inc();
        if lease.epoch > 1 {
            self.takeovers.inc();
        }
    }

    /// What of `commit` the metrics need, taken before the store has it
    /// (a few small values: the commit itself is not copied).
    pub fn summarize(commit: &Commit) -> Seen {
        let ended = commit
            .run_update
            .as_ref()
            .filter(|u| u.status.is_terminal())
            .map(|u| u.status.as_str());
        let events = commit
            .events
            .iter()
            .filter_map(|e| {
                if !matches!(
                    e.kind.as_str(),
                    "step_started" | "step_finished" | "tool_called"
                ) {
                    return None;
                }
                // An event whose fields are not what these kinds carry is
                // left out of the metrics, as one without a step is.
                let body: Peek<'_> = serde_json::from_str(e.body.as_str()).ok()?;
                let owned = |s: Option<Cow<'_, str>>| s.map(Cow::into_owned);
                match e.kind.as_str() {
                    "step_started" => Some(SeenEvent::StepStarted {
                        step: owned(body.step)?,
                        iteration: body.iteration,
                        at: e.at,
                        kind: owned(body.kind)?,
                    }),
                    "step_finished" => Some(SeenEvent::StepFinished {
                        step: owned(body.step)?,
                        iteration: body.iteration,
                        at: e.at,
                        status: owned(body.status).unwrap_or_else(|| "unknown".into()),
                    }),
                    _ => {
                        let record = body.record.unwrap_or_default();
                        Some(SeenEvent::ToolCalled {
                            tool: owned(body.tool.and_then(|t| t.name))
                                .unwrap_or_else(|| "unknown".into()),
                            wall_us: record.wall_time_us,
                            fuel: record.fuel_consumed,
                            memory: record.memory_peak_bytes,
                        })
                    }
                }
            })
            .collect();
        Seen {
            run: commit.run.clone(),
            ended,
            events,
        }
    }

    /// A commit the store took (`ok`) or refused, and how long it took.
    pub fn committed(&self, seen: Seen, seconds: f64, ok: bool) {
        if !ok {
            self.commit_errors.inc();
            return;
        }
        self.commits.observe(seconds);
        if let Some(status) = seen.ended {
            self.runs_ended
                .get_or_create(&StatusLabel {
                    status: status.to_owned(),
                })
                .inc();
        }
        for e in seen.events {
            match e {
                SeenEvent::StepStarted {
                    step,
                    iteration,
                    at,
                    kind,
                } => {
                    let mut open = self.open_steps.lock().unwrap_or_else(|p| p.into_inner());
                    if open.len() < OPEN_STEPS_CAP {
                        open.insert((seen.run.clone(), step, iteration), (at, kind));
                    }
                }
                SeenEvent::StepFinished {
                    step,
                    iteration,
                    at,
                    status,
                } => {
                    let started = self
                        .open_steps
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&(seen.run.clone(), step, iteration));
                    if let Some((began, kind)) = started {
                        let ms = at.saturating_sub(began).max(0);
                        self.steps
                            .get_or_create(&StepLabel { kind, status })
                            .observe(ms as f64 / 1000.0);
                    }
                }
                SeenEvent::ToolCalled {
                    tool,
                    wall_us,
                    fuel,
                    memory,
                } => {
                    let label = ToolLabel { tool };
                    if let Some(us) = wall_us {
                        self.guest_calls
                            .get_or_create(&label)
                            .observe(us as f64 / 1_000_000.0);
                    }
                    if let Some(fuel) = fuel {
                        self.guest_fuel.get_or_create(&label).observe(fuel as f64);
                    }
                    if let Some(bytes) = memory {
                        self.guest_memory
                            .get_or_create(&label)
                            .observe(bytes as f64);
                    }
                }
            }
        }
    }

    /// The text exposition, with the scheduler's gauges as of now.
    pub fn render(&self, sched: &poimen_executor::SchedulerStats) -> String {
        let mut guard = self.shed_seen.lock().unwrap_or_else(|p| p.into_inner());
        let (low, normal) = &mut *guard;
        for (priority, now, seen) in [
            ("low", sched.shed_low, low),
            ("normal", sched.shed_normal, normal),
        ] {
            self.shed
                .get_or_create(&PriorityLabel {
                    priority: priority.to_owned(),
                })
                .inc_by(now.saturating_sub(*seen));
            *seen = now;
        }
        drop(guard);
        self.queued
            .set(i64::try_from(sched.queued).unwrap_or(i64::MAX));
        self.running
            .set(i64::try_from(sched.running).unwrap_or(i64::MAX));
        self.workers
            .set(i64::try_from(sched.workers).unwrap_or(i64::MAX));
        for level in ["ok", "warn", "shed"] {
            self.pressure
                .get_or_create(&LevelLabel {
                    level: level.to_owned(),
                })
                .set(i64::from(
                    sched.pressure.map(|p| p.to_string()).as_deref() == Some(level),
                ));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
