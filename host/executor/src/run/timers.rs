//! A run's clocks: the limits that interrupt it while it is driven
//! (`limits.deadline`, `budget.wall_time`, an unload drain's deadline), and
//! the timer it leaves in the store while it waits, so that whichever host
//! serves the store looks at it again when a judgment request expires or
//! its deadline passes — after a restart too.
//!
//! While a run is driven, one task sleeps until its earliest limit and then
//! interrupts the run's scope ([`RunScope::interrupt`]): in-flight tool
//! calls and child runs are dropped like a cancel's, and the walk records
//! the run's end as the interruption says (failed for a limit, cancelled
//! for an unload). An unload decided while the run is driven is heard by
//! polling the store every third of the lease's time to live.

use std::sync::Arc;
use std::time::Duration;

use poimen_store::RunStatus;

use super::{Batch, Halt, RunCtx, StatusChange};
use crate::episode::{EpisodeEvent, StepStatus};
use crate::scope::Interruption;
use crate::state::RunState;
use poimen_workflow::StepKind;

/// Stops the run's timer task when the drive ends.
pub(crate) struct Timers(Option<tokio::task::JoinHandle<()>>);

impl Drop for Timers {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}

fn ms(d: u64) -> i64 {
    i64::try_from(d).unwrap_or(i64::MAX)
}

impl RunCtx {
    /// When the run's `limits.deadline` passes (waiting included).
    fn deadline_at(&self, snap: &RunState) -> Option<i64> {
        let limit = self.runnable.def.limits.deadline?;
        Some(snap.started_at.saturating_add(ms(limit.0)))
    }

    /// When the run's wall-time budget is spent, if it is driven from `now`
    /// on without waiting.
    fn wall_time_at(&self, snap: &RunState, now: i64) -> Option<i64> {
        let budget = self.runnable.def.budget.wall_time?;
        let elapsed = u64::try_from(now.saturating_sub(snap.started_at)).unwrap_or(0);
        let active = elapsed.saturating_sub(snap.spent.waiting_ms);
        Some(now.saturating_add(ms(budget.0.saturating_sub(active))))
    }

    /// The earliest limit of the driven run, and what it interrupts with.
    fn next_limit(&self, snap: &RunState, unload: Option<i64>) -> Option<(i64, Interruption)> {
        let now = self.kernel.clock.now_ms();
        let mut limits = Vec::new();
        if let (Some(at), Some(limit)) = (self.deadline_at(snap), self.runnable.def.limits.deadline)
        {
            limits.push((
                at,
                Interruption::Deadline {
                    elapsed_ms: 0,
                    limit_ms: limit.0,
                },
            ));
        }
        if let (Some(at), Some(budget)) = (
            self.wall_time_at(snap, now),
            self.runnable.def.budget.wall_time,
        ) {
            limits.push((
                at,
                Interruption::WallTime {
                    active_ms: 0,
                    budget_ms: budget.0,
                },
            ));
        }
        if let Some(at) = unload {
            limits.push((at, Interruption::Unloaded { deadline_ms: at }));
        }
        limits.into_iter().min_by_key(|(at, _)| *at)
    }

    /// The interruption as it reads when it fires at `now`.
    fn fired(&self, snap: &RunState, why: Interruption, now: i64) -> Interruption {
        let elapsed = u64::try_from(now.saturating_sub(snap.started_at)).unwrap_or(0);
        match why {
            Interruption::Deadline { limit_ms, .. } => Interruption::Deadline {
                elapsed_ms: elapsed,
                limit_ms,
            },
            Interruption::WallTime { budget_ms, .. } => Interruption::WallTime {
                active_ms: elapsed.saturating_sub(snap.spent.waiting_ms),
                budget_ms,
            },
            other => other,
        }
    }

    /// Arms the run's limits for this drive: one already passed interrupts
    /// the run now (before anything more is done); the earliest to come is
    /// waited for on a task of its own.
    pub(crate) async fn start_timers(self: &Arc<Self>) -> Timers {
        let unload = self
            .store
            .unload_deadline(&self.runnable.version)
            .await
            .unwrap_or(None);
        let snap = self.snapshot().await;
        let now = self.kernel.clock.now_ms();
        let next = self.next_limit(&snap, unload);
        if let Some((at, why)) = &next
            && *at <= now
        {
            self.scope.interrupt(self.fired(&snap, why.clone(), now));
            return Timers(None);
        }
        // Only a top-level run listens for an unload decided meanwhile: a
        // child run ends with its parent.
        let poll = (self.depth == 0 && unload.is_none()).then(|| {
            Duration::from_millis(u64::try_from(self.kernel.config.lease_ttl_ms / 3).unwrap_or(1))
        });
        if next.is_none() && poll.is_none() {
            return Timers(None);
        }
        let ctx = self.clone();
        Timers(Some(tokio::spawn(async move {
            let mut next = next;
            loop {
                let fire = async {
                    match &next {
                        Some((at, _)) => ctx.kernel.clock.sleep_until(*at).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                let listen = async {
                    match poll {
                        Some(p) => tokio::time::sleep(p).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    () = fire => {
                        if let Some((_, why)) = next.take() {
                            let snap = ctx.snapshot().await;
                            let now = ctx.kernel.clock.now_ms();
                            ctx.scope.interrupt(ctx.fired(&snap, why, now));
                        }
                        return;
                    }
                    () = listen => {
                        if let Ok(Some(deadline)) = ctx.store.unload_deadline(&ctx.runnable.version).await {
                            let snap = ctx.snapshot().await;
                            next = ctx.next_limit(&snap, Some(deadline));
                        }
                    }
                }
            }
        })))
    }

    /// The timer a waiting run leaves in the store: the earliest of its
    /// deadline, the expiry of each request it waits for (and `extra`), and
    /// its version's unload deadline.
    pub(crate) fn next_timer(&self, snap: &RunState, extra: Option<i64>) -> Option<i64> {
        let expiries = snap
            .steps
            .values()
            .filter_map(|s| s.judgment.as_ref())
            .filter(|j| j.result.is_none())
            .filter_map(|j| j.expires_at);
        // A fan-out, choice or child run bounded by its timeout, waiting.
        let bounded = snap.steps.iter().filter_map(|(id, st)| {
            if !matches!(st.status, StepStatus::Running | StepStatus::Waiting) {
                return None;
            }
            let def = self.runnable.step(id)?;
            match &def.kind {
                StepKind::Parallel(_) | StepKind::Conditional(_) | StepKind::SubWorkflow(_) => {
                    def.timeout.map(|t| st.started_at.saturating_add(ms(t.0)))
                }
                // A workflow called as a tool: its child run, like a
                // sub-workflow's.
                StepKind::Tool(t)
                    if snap
                        .tools
                        .get(&t.tool.to_string())
                        .is_some_and(|p| p.workflow.is_some()) =>
                {
                    def.timeout.map(|t| st.started_at.saturating_add(ms(t.0)))
                }
                _ => None,
            }
        });
        [self.deadline_at(snap), extra]
            .into_iter()
            .flatten()
            .chain(expiries)
            .chain(bounded)
            .min()
    }

    /// When the run (or a child run it waits for) must be looked at
    /// again: the earliest of its own timers and its children's requests'
    /// expiries.
    pub(crate) async fn due_at(&self, snap: &RunState) -> Option<i64> {
        let own = self.next_timer(snap, None);
        let children = children_due_at(&*self.store, snap, 0).await;
        [own, children].into_iter().flatten().min()
    }

    /// A waiting run driven again: if one of its timers has come (or one
    /// of a child run it waits for), it resumes — the walk then meets what
    /// is due (an expired request, a passed deadline); otherwise it stays
    /// waiting.
    pub(crate) async fn wake_if_due(&self) -> Result<(), Halt> {
        let snap = self.snapshot().await;
        if snap.status != Some(RunStatus::WaitingJudgment) {
            return Ok(());
        }
        let now = self.kernel.clock.now_ms();
        if self.due_at(&snap).await.is_some_and(|at| at <= now) {
            self.commit(Batch::status(
                vec![EpisodeEvent::RunResumed {
                    reason: "a timer came due".into(),
                }],
                StatusChange::to(RunStatus::Running),
            ))
            .await?;
        }
        Ok(())
    }

    /// Leaves the waiting run's next timer in the store. Only a top-level
    /// run has one: a child's timers are its root's (a serving host drives
    /// a child run through its root).
    pub(crate) async fn set_timer(&self) {
        if self.depth > 0 {
            return;
        }
        let snap = self.snapshot().await;
        if snap.status != Some(RunStatus::WaitingJudgment) {
            return;
        }
        let at = self.due_at(&snap).await;
        if let Err(e) = self.store.set_wake(&self.run, at).await {
            tracing::warn!(run = %self.run, "could not set the run's timer: {e}");
        }
    }
}

/// The earliest expiry of a judgment request that the child runs `snap`
/// waits for (and theirs, down the tree) are waiting on.
fn children_due_at<'a>(
    store: &'a dyn poimen_store::Store,
    snap: &'a RunState,
    depth: u32,
) -> futures::future::BoxFuture<'a, Option<i64>> {
    use futures::FutureExt;
    async move {
        if depth > crate::kernel::MAX_SUBWORKFLOW_DEPTH {
            return None;
        }
        let mut earliest: Option<i64> = None;
        for step in snap.steps.values() {
            let Some(child) = step.child.as_ref().filter(|c| c.finished.is_none()) else {
                continue;
            };
            let Ok(state) = super::state(store, &child.run).await else {
                continue;
            };
            if state.status != Some(RunStatus::WaitingJudgment) {
                continue;
            }
            let own = own_expiry(&state);
            let below = children_due_at(store, &state, depth + 1).await;
            earliest = [earliest, own, below].into_iter().flatten().min();
        }
        earliest
    }
    .boxed()
}

/// The earliest expiry of a run's open judgment requests — read from its
/// state alone (a child's deadline is checked when it is driven).
fn own_expiry(state: &RunState) -> Option<i64> {
    state
        .steps
        .values()
        .filter_map(|s| s.judgment.as_ref())
        .filter(|j| j.result.is_none())
        .filter_map(|j| j.expires_at)
        .min()
}
