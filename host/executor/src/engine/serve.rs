//! Serving a store: a long-lived host claims the runs that need a driver —
//! queued runs and runs whose lease expired because their host stopped —
//! drives each under its lease, and on shutdown stops claiming, lets what it
//! holds finish within a grace period, and hands back the rest.
//!
//! Several hosts may serve one store: the store hands each claimable run to
//! one of them (`Store::claim_runnable`), and fencing stops a host that lost
//! a run from writing to it (see `lease.rs`). Child runs are not driven on
//! their own: their root's driver drives them, so a claimed child is handed
//! back at once and its root is claimed instead.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use poimen_store::{Lease, RunId, RunRecord};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::{Executor, RunError};
use crate::run::RunOutcome;

/// How a host serves its store.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Runs driven at once (at least 1).
    pub workers: usize,
    /// How often the store is asked for claimable runs when nothing woke
    /// the host earlier.
    pub poll: Duration,
    /// On shutdown, how long the runs being driven may take to finish
    /// before they are stopped and their leases handed back.
    pub grace: Duration,
    /// Slots for runs at once shared with whatever else drives runs on
    /// this host (the HTTP API's one-request starts): the loop claims a
    /// run only with a slot in hand, and holds it while it drives the run.
    /// `None`: `workers` alone bounds the loop.
    pub slots: Option<Arc<Semaphore>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            workers: 8,
            poll: Duration::from_millis(100),
            grace: Duration::from_secs(10),
            slots: None,
        }
    }
}

/// What a serving host did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServeReport {
    /// Runs claimed and driven (each once per claim).
    pub driven: u64,
    /// Runs still being driven when the grace period ended, stopped and
    /// handed back (their leases released).
    pub handed_back: Vec<RunId>,
}

impl Executor {
    /// Claims up to `limit` runs that need a driver, for this host. Child
    /// runs are handed back (their root's driver drives them).
    pub async fn claim_runnable(&self, limit: u32) -> Result<Vec<(RunRecord, Lease)>, RunError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let k = &self.kernel;
        let claimed = k
            .store
            .claim_runnable(
                &k.config.host_id,
                k.clock.now_ms(),
                k.config.lease_ttl_ms,
                limit,
            )
            .await?;
        let mut roots = Vec::with_capacity(claimed.len());
        for (rec, lease) in claimed {
            if rec.parent.is_some() {
                k.store.release_lease(&lease).await?;
                if let Ok(root) = self.root_of(&rec.id).await
                    && let Some(l) = k
                        .store
                        .claim_run(
                            &root,
                            &k.config.host_id,
                            k.clock.now_ms(),
                            k.config.lease_ttl_ms,
                        )
                        .await?
                    && let Some((_, r)) = k.locate(&root).await?
                {
                    roots.push((r, l));
                }
            } else {
                roots.push((rec, lease));
            }
        }
        Ok(roots)
    }

    /// Drives a run this host claimed, under its lease.
    pub async fn drive_claimed(&self, run: &RunId, lease: Lease) -> Result<RunOutcome, RunError> {
        self.drive_root(run, Some(lease)).await
    }

    /// Serves the store until `shutdown` resolves: claims runs while fewer
    /// than `workers` are being driven, drives each on its own task, and on
    /// shutdown stops claiming, waits up to `grace` for the runs it drives,
    /// then stops the rest and releases their leases (their episodes end
    /// at their last commit; the next claimer resumes them).
    pub async fn serve(
        &self,
        opts: ServeOptions,
        shutdown: impl Future<Output = ()>,
    ) -> Result<ServeReport, RunError> {
        let workers = opts.workers.max(1);
        let mut tasks: JoinSet<(RunId, Result<RunOutcome, RunError>)> = JoinSet::new();
        let mut report = ServeReport::default();
        tokio::pin!(shutdown);
        loop {
            while let Some(done) = tasks.try_join_next() {
                log_done(done);
            }
            // Under pressure, claim nothing new: the queued runs wait for
            // a host (this one, later, or another) with workers to spare.
            let free = if self.kernel.sched.pressure() == crate::sched::Pressure::Ok {
                workers.saturating_sub(tasks.len())
            } else {
                0
            };
            // With shared slots, as many as are free of those too.
            let mut permits: Vec<OwnedSemaphorePermit> = match &opts.slots {
                Some(slots) => (0..free)
                    .map_while(|_| slots.clone().try_acquire_owned().ok())
                    .collect(),
                None => Vec::new(),
            };
            let free = if opts.slots.is_some() {
                permits.len()
            } else {
                free
            };
            let claimed = match self.claim_runnable(free as u32).await {
                Ok(c) => c,
                Err(RunError::Store(e)) => {
                    // The store is unreachable or refused: keep serving
                    // what is held; try again at the next poll.
                    tracing::warn!("claiming runs failed: {e}");
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            let got = !claimed.is_empty();
            for (rec, lease) in claimed {
                report.driven += 1;
                let exec = self.clone();
                let slot = permits.pop();
                tasks.spawn(async move {
                    let _slot = slot;
                    let out = exec.drive_claimed(&rec.id, lease).await;
                    let out = exec.cancelled_elsewhere(&rec.id, out).await;
                    (rec.id, out)
                });
            }
            // The slots taken and not used go back before the loop waits.
            drop(permits);
            // Claim again at once while there is work and room.
            if got && tasks.len() < workers {
                continue;
            }
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => log_done(done),
                // A write that may have made work wakes the host (on
                // PostgreSQL, any host's: LISTEN/NOTIFY); the poll is the
                // fallback.
                () = self.kernel.store.wait_for_work(opts.poll) => {}
            }
        }
        // Shutdown: let the runs being driven finish, within the grace.
        let deadline = tokio::time::Instant::now() + opts.grace;
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(done)) => log_done(done),
                Ok(None) => break,
                Err(_) => break,
            }
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        // Hand back what is still held.
        let k = &self.kernel;
        for rec in k.store.runs_owned_by(&k.config.host_id).await? {
            if let Some(lease) = rec.lease {
                k.store.release_lease(&lease).await?;
                report.handed_back.push(rec.id);
            }
        }
        Ok(report)
    }
}

impl Executor {
    /// A run halted by a refused write whose lease ended because an
    /// operator cancelled it (from any host) is reported as cancelled: the
    /// host obeyed the cancel, whether its heartbeat or its next write heard
    /// it first.
    async fn cancelled_elsewhere(
        &self,
        run: &RunId,
        out: Result<RunOutcome, RunError>,
    ) -> Result<RunOutcome, RunError> {
        let Ok(mut o) = out else { return out };
        let lost = o.status == poimen_store::RunStatus::Running
            && o.reason
                .as_deref()
                .is_some_and(|r| r.contains("no longer holds"));
        if lost
            && let Ok(Some(rec)) = self.kernel.store.run(run).await
            && rec.status == poimen_store::RunStatus::Cancelled
        {
            tracing::info!(%run, "the run was cancelled elsewhere; this host stops driving it");
            o.status = rec.status;
            o.reason = rec.reason;
        }
        Ok(o)
    }
}

fn log_done(done: Result<(RunId, Result<RunOutcome, RunError>), tokio::task::JoinError>) {
    match done {
        // Halted while still running: the store refused a write (a lost
        // lease, an unreachable store). The next claimer carries on.
        Ok((run, Ok(o))) if o.status == poimen_store::RunStatus::Running => {
            let reason = o.reason.unwrap_or_default();
            if reason.contains("no longer holds") {
                tracing::warn!(%run, "this host lost its lease on the run and stopped driving it: {reason}");
            } else {
                tracing::warn!(%run, "the run stopped; another claim resumes it: {reason}");
            }
        }
        Ok((run, Ok(o))) => tracing::info!(%run, status = %o.status, "run driven"),
        Ok((run, Err(RunError::Held { .. }))) => {
            tracing::debug!(%run, "run taken by another host")
        }
        Ok((run, Err(e))) => tracing::warn!(%run, "driving the run failed: {e}"),
        Err(e) if e.is_cancelled() => {}
        Err(e) => tracing::error!("a driving task panicked: {e}"),
    }
}
