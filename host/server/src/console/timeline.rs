//! The run page's timeline: a Gantt of the run's step executions and their
//! attempts over time, folded from the episode alone. Each fan-out branch
//! gets a lane of its own (and the steps it owns ride in it); every other
//! step is in the `main` lane. Positions are percents of the run's span,
//! so the page places bars with CSS alone.

use std::collections::{BTreeMap, BTreeSet};

use poimen::{EpisodeEvent, Recorded, StepStatus};
use serde::Serialize;

/// The timeline of one run.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Timeline {
    /// Milliseconds from the first event to the last (or to now).
    pub span_ms: i64,
    pub lanes: Vec<Lane>,
}

/// A row of bars that never overlap in a well-formed run.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Lane {
    pub name: String,
    pub bars: Vec<Bar>,
}

/// One step execution (a step at one loop iteration).
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Bar {
    pub step: String,
    pub iteration: u32,
    pub label: String,
    /// Hover text: what happened, in words.
    pub title: String,
    /// CSS class: the step's status (`completed`, `failed`, `lost`, …).
    pub class: &'static str,
    pub left: f64,
    pub width: f64,
    /// Attempts, placed within the bar (percents of the bar); the gaps
    /// between them are the backoff.
    pub attempts: Vec<Segment>,
    /// The child run of a sub-workflow step.
    pub child: Option<String>,
}

/// One attempt inside its bar.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Segment {
    pub attempt: u32,
    pub left: f64,
    pub width: f64,
    pub failed: bool,
}

struct Open {
    lane: String,
    from: i64,
    to: Option<i64>,
    status: Option<StepStatus>,
    attempts: Vec<(u32, i64, Option<i64>, bool)>,
    child: Option<String>,
}

/// Folds `events` (in `seq` order) into lanes; `now` ends what has not.
pub(crate) fn of(events: &[Recorded], now: i64) -> Timeline {
    let Some(first) = events.first() else {
        return Timeline {
            span_ms: 0,
            lanes: Vec::new(),
        };
    };
    let start = first.at;
    let mut end = events.last().map_or(start, |e| e.at);
    let mut branches: BTreeSet<String> = BTreeSet::new();
    let mut losers: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut lane_of: BTreeMap<String, String> = BTreeMap::new();
    // Branch lanes in the order their fan-outs declare them.
    let mut declared: Vec<String> = Vec::new();
    let mut order: Vec<(String, u32)> = Vec::new();
    let mut open: BTreeMap<(String, u32), Open> = BTreeMap::new();
    let mut ended = false;
    for r in events {
        match &r.event {
            EpisodeEvent::BranchesForked {
                step, branches: bs, ..
            } => {
                for b in bs {
                    branches.insert(b.to_string());
                    let lane = format!("{step} ▸ {b}");
                    if !declared.contains(&lane) {
                        declared.push(lane.clone());
                    }
                    lane_of.insert(b.to_string(), lane);
                }
            }
            EpisodeEvent::BranchesJoined {
                iteration,
                losers: ls,
                ..
            } => {
                for l in ls {
                    losers.insert((l.to_string(), *iteration));
                }
            }
            EpisodeEvent::StepStarted {
                step,
                iteration,
                owner,
                ..
            } => {
                let id = step.to_string();
                let lane = if branches.contains(&id) {
                    lane_of.get(&id).cloned()
                } else {
                    owner
                        .as_ref()
                        .and_then(|o| lane_of.get(o.as_str()).cloned())
                }
                .unwrap_or_else(|| "main".to_owned());
                lane_of.entry(id.clone()).or_insert_with(|| lane.clone());
                let key = (id, *iteration);
                if !open.contains_key(&key) {
                    order.push(key.clone());
                }
                open.insert(
                    key,
                    Open {
                        lane,
                        from: r.at,
                        to: None,
                        status: None,
                        attempts: Vec::new(),
                        child: None,
                    },
                );
            }
            EpisodeEvent::AttemptStarted {
                step,
                iteration,
                attempt,
            } => {
                if let Some(o) = open.get_mut(&(step.to_string(), *iteration)) {
                    o.attempts.push((*attempt, r.at, None, false));
                }
            }
            EpisodeEvent::AttemptFinished {
                step,
                iteration,
                attempt,
                failure,
                ..
            } => {
                if let Some(o) = open.get_mut(&(step.to_string(), *iteration))
                    && let Some(a) = o.attempts.iter_mut().rev().find(|a| a.0 == *attempt)
                {
                    a.2 = Some(r.at);
                    a.3 = failure.is_some();
                }
            }
            EpisodeEvent::StepFinished {
                step,
                iteration,
                status,
                ..
            } => {
                if let Some(o) = open.get_mut(&(step.to_string(), *iteration)) {
                    o.to = Some(r.at);
                    o.status = Some(*status);
                }
            }
            EpisodeEvent::ChildRunLinked {
                step,
                iteration,
                child_run,
                ..
            } => {
                if let Some(o) = open.get_mut(&(step.to_string(), *iteration)) {
                    o.child = Some(child_run.to_string());
                }
            }
            EpisodeEvent::RunCompleted { .. }
            | EpisodeEvent::RunFailed { .. }
            | EpisodeEvent::RunCancelled { .. } => ended = true,
            _ => {}
        }
    }
    if !ended {
        end = end.max(now);
    }
    let span = (end - start).max(1);
    let pct = |t: i64| ((t - start) as f64 * 100.0 / span as f64).clamp(0.0, 100.0);
    let mut lanes: Vec<Lane> = Vec::new();
    for key in order {
        let Some(o) = open.remove(&key) else {
            continue;
        };
        let (step, iteration) = key;
        let lost = losers.contains(&(step.clone(), iteration))
            || matches!(o.status, Some(StepStatus::Lost));
        let class = if lost {
            "lost"
        } else {
            match o.status {
                Some(StepStatus::Completed) => "completed",
                Some(StepStatus::Failed) => "failed",
                Some(StepStatus::Cancelled) => "cancelled",
                Some(StepStatus::Waiting) => "waiting",
                _ => "running",
            }
        };
        let to = o.to.unwrap_or(end);
        let (left, right) = (pct(o.from), pct(to));
        let width = (right - left).max(0.4);
        let bar_ms = (to - o.from).max(1) as f64;
        let attempts: Vec<Segment> = o
            .attempts
            .iter()
            .map(|&(attempt, from, until, failed)| {
                let until = until.unwrap_or(to);
                let l = ((from - o.from) as f64 * 100.0 / bar_ms).clamp(0.0, 100.0);
                let w = ((until - from) as f64 * 100.0 / bar_ms).clamp(0.0, 100.0 - l);
                Segment {
                    attempt,
                    left: round(l),
                    width: round(w),
                    failed,
                }
            })
            .collect();
        let tries = o.attempts.len();
        let mut label = step.clone();
        // Iterations count from 1: a number only for a loop's re-entries.
        if iteration > 1 {
            label.push_str(&format!(" #{iteration}"));
        }
        if tries > 1 {
            label.push_str(&format!(" ×{tries}"));
        }
        if lost {
            label.push_str(" (lost)");
        }
        let title = format!(
            "{step} iteration {iteration}: {class}, {} ms, {tries} attempt{}",
            to - o.from,
            if tries == 1 { "" } else { "s" }
        );
        let bar = Bar {
            step,
            iteration,
            label,
            title,
            class,
            left: round(left),
            width: round(width),
            attempts,
            child: o.child,
        };
        match lanes.iter_mut().find(|l| l.name == o.lane) {
            Some(l) => l.bars.push(bar),
            None => lanes.push(Lane {
                name: o.lane,
                bars: vec![bar],
            }),
        }
    }
    // The spine first, then branches as their fan-outs declare them (not
    // as they happened to start: concurrent branches start in any order).
    lanes.sort_by_key(|l| {
        (
            l.name != "main",
            declared
                .iter()
                .position(|d| d == &l.name)
                .unwrap_or(usize::MAX),
        )
    });
    Timeline {
        span_ms: end - start,
        lanes,
    }
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
