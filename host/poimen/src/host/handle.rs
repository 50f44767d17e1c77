//! [`RunHandle`]: a started run, to wait for, cancel and follow.
//!
//! A run started on this host ([`crate::Host::start`]) is driven by a task
//! of its own; the task's result — the outcome, or the error that stopped
//! it — reaches the handle, never only a log line. A handle to a run driven
//! elsewhere ([`crate::Host::handle`]) waits on the store instead.
//!
//! This module knows the host's verbs and the driver's result; how a run is
//! driven is the executor's business.

use std::sync::Arc;

use futures::Stream;
use poimen_executor::{RunError, RunOutcome};
use poimen_store::{RunId, RunRecord, RunStatus};
use tokio::sync::watch;

use super::{Error, Host};
use crate::events::RunEvent;

/// What the task driving a run came to: `None` until it stops.
pub(crate) type Driven = Option<Result<RunOutcome, Arc<RunError>>>;

/// A run: its id, and the ways to wait for it, cancel it and follow its
/// events. Cheap to clone; dropping it does not stop the run.
#[derive(Clone)]
pub struct RunHandle {
    id: RunId,
    host: Host,
    /// The result of this host's driving task, when this host drives it.
    driver: Option<watch::Receiver<Driven>>,
    /// The run's start may not be durable yet ([`Host::start_waiting`]).
    deferred: bool,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle")
            .field("id", &self.id)
            .field("driven_here", &self.driver.is_some())
            .finish()
    }
}

impl RunHandle {
    pub(crate) fn new(id: RunId, host: Host, driver: Option<watch::Receiver<Driven>>) -> Self {
        RunHandle {
            id,
            host,
            driver,
            deferred: false,
        }
    }

    /// This handle's run was started by a waiting caller.
    pub(crate) fn deferred(self) -> Self {
        RunHandle {
            deferred: true,
            ..self
        }
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// Waits until the run completes, fails, is cancelled, waits for a
    /// judgment or blocks for an operator, and returns its outcome. If this
    /// host's task driving it stopped with an error, that error
    /// ([`Error::Driver`]). Otherwise the run's status is read from the
    /// store: a run answered or cancelled since it stopped is reported as
    /// it is now, and one the task let go while it was still running (its
    /// lease was taken over, the host shuts down) is waited for, whichever
    /// host drives it now.
    pub async fn wait(&self) -> Result<RunOutcome, Error> {
        if let Some(rx) = &self.driver {
            let mut rx = rx.clone();
            let driven = rx.wait_for(Option::is_some).await.map(|d| d.clone());
            match driven {
                // Stopped or let go: what the run is now is the store's to
                // say (an answer or a cancel may have moved it on since).
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(cause))) => {
                    return Err(Error::Driver {
                        run: self.id.clone(),
                        cause,
                    });
                }
                Ok(None) => {}
                Err(_) => {
                    return Err(Error::DriverDied {
                        run: self.id.clone(),
                    });
                }
            }
        }
        let rec = self.host.wait(&self.id, None).await?;
        self.outcome_of(rec).await
    }

    /// [`wait`](Self::wait), giving up after `timeout` with
    /// [`Error::Timeout`] (the run goes on).
    pub async fn wait_for(&self, timeout: std::time::Duration) -> Result<RunOutcome, Error> {
        match tokio::time::timeout(timeout, self.wait()).await {
            Ok(r) => r,
            Err(_) => {
                let (rec, _) = self.host.status(&self.id).await?;
                Err(Error::Timeout {
                    run: self.id.clone(),
                    status: rec.status,
                    after: timeout,
                })
            }
        }
    }

    /// Waits up to `within` for this host's task driving the run to stop
    /// (completed, failed, cancelled, waiting or blocked) and returns the
    /// run's stored record and its output, read once; `None` if it has not
    /// stopped by then (the run goes on), or if no task of this host drives
    /// it. The one-request start of the HTTP API (`POST /v1/runs?wait=`)
    /// answers with this: the record is read after the run's final commit,
    /// so what it says is durable. A run started waiting
    /// ([`Host::start_waiting`]) that has not stopped is made durable
    /// before this returns, so its id may be handed out.
    pub async fn stopped_within(
        &self,
        within: std::time::Duration,
    ) -> Result<Option<(RunRecord, Option<serde_json::Value>)>, Error> {
        let Some(rx) = &self.driver else {
            return Ok(None);
        };
        let mut rx = rx.clone();
        let driven = match tokio::time::timeout(within, rx.wait_for(Option::is_some)).await {
            Err(_) => None,
            Ok(d) => Some(d.map(|d| d.clone())),
        };
        let outcome = match driven {
            Some(Ok(Some(Ok(outcome)))) => outcome,
            Some(Ok(Some(Err(cause)))) => {
                self.make_durable().await?;
                return Err(Error::Driver {
                    run: self.id.clone(),
                    cause,
                });
            }
            None | Some(Ok(None)) => {
                self.make_durable().await?;
                return Ok(None);
            }
            Some(Err(_)) => {
                self.make_durable().await?;
                return Err(Error::DriverDied {
                    run: self.id.clone(),
                });
            }
        };
        let rec = self.host.inner.executor().status(&self.id).await?;
        if matches!(rec.status, RunStatus::Running | RunStatus::Queued) {
            // Let go while still running (its lease taken over, the host
            // shutting down): not a durable stop.
            self.make_durable().await?;
        }
        // The output the driver saw is the stored one unless the run moved
        // on since (an answer, a cancel): then the store says.
        let output = if rec.status == outcome.status {
            outcome.output
        } else {
            self.host.status(&self.id).await?.1.output
        };
        Ok(Some((rec, output)))
    }

    /// Waits until this host's task driving the run has stopped — at once
    /// if no task of this host drives it. The run itself may go on (on
    /// another host, after an answer).
    pub async fn driver_stopped(&self) {
        if let Some(rx) = &self.driver {
            let mut rx = rx.clone();
            let _ = rx.wait_for(Option::is_some).await;
        }
    }

    /// A deferred start that has not ended in a durable stop: made durable
    /// now, before the run's id leaves the host.
    async fn make_durable(&self) -> Result<(), Error> {
        if self.deferred {
            self.host.inner.executor().make_durable(&self.id).await?;
        }
        Ok(())
    }

    /// Cancels the run (recorded in its episode; a host driving it stops
    /// at its next step or heartbeat) and returns its record.
    pub async fn cancel(&self) -> Result<RunRecord, Error> {
        self.host.cancel(&self.id).await
    }

    /// The run's episode events from sequence number `from` on (0: from
    /// its start), then each as it is committed; the stream ends after the
    /// event that ends the run. Resumable: a follower that reconnects asks
    /// again from the sequence number after the last one it saw. Gapless: a
    /// follower that fell behind reads what it missed from the store.
    pub fn events(
        &self,
        from: u64,
    ) -> impl Stream<Item = Result<RunEvent, Error>> + Send + 'static {
        self.host.run_events(&self.id, from)
    }

    /// The run's outcome as its record and episode say.
    async fn outcome_of(&self, rec: RunRecord) -> Result<RunOutcome, Error> {
        let (_, state) = self.host.status(&rec.id).await?;
        Ok(RunOutcome {
            run: rec.id,
            status: rec.status,
            output: state.output.clone(),
            reason: rec.reason,
            state,
        })
    }
}
