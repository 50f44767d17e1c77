//! Leases: at most one host drives a run at a time.
//!
//! A host drives a run only while it holds the run's lease (claimed from the
//! store: an owner, an expiry and a fencing epoch that grows with every
//! claim). Every commit of the run carries the lease's [`Fence`], so once
//! another host has taken the run over — after this host stopped renewing,
//! or a second process under the same host id claimed it — the store
//! refuses this host's next write with `StoreError::LeaseLost` and nothing
//! of it lands: the walk halts there, and the new holder carries on from
//! the episode. Every effect is preceded by a fenced commit (its `Pending`
//! and `Dispatched` intents), so a host that lost a run dispatches nothing
//! more for it. (An effect-free call writes nothing ahead of itself; one
//! that a lost host still makes changes nothing, and its outcome's commit
//! is refused.)
//!
//! While a run is driven, a heartbeat task renews its lease every third of
//! the lease's time to live; the lease is released when the driving stops
//! (the run ended, waits, is blocked, or the walk halted), so the next
//! claimer does not wait for it to expire.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use poimen_store::{Fence, Lease, Store, StoreError};

use crate::kernel::Kernel;
use crate::scope::RunScope;

/// This host's tenure on one run: the lease it holds, kept current by the
/// heartbeat.
#[derive(Debug)]
pub(crate) struct Tenure {
    lease: Mutex<Lease>,
}

impl Tenure {
    pub fn new(lease: Lease) -> Arc<Tenure> {
        Arc::new(Tenure {
            lease: Mutex::new(lease),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease as last claimed or renewed.
    pub fn lease(&self) -> Lease {
        self.lock().clone()
    }

    /// What this host's commits of the run carry.
    pub fn fence(&self) -> Fence {
        self.lock().fence()
    }

    /// Keeps the lease alive until the returned guard is dropped, then
    /// releases it. `scope` is the drive this tenure is for: when the
    /// heartbeat finds the lease gone (taken over, claimed again by this
    /// host under a newer tenure, or ended by an operator's cancel), it
    /// stops that drive — its guest calls included — since none of its
    /// writes would land any more.
    pub fn hold(
        self: &Arc<Self>,
        kernel: &Arc<Kernel>,
        store: Arc<dyn Store>,
        scope: RunScope,
    ) -> Holding {
        let ttl = kernel.config.lease_ttl_ms.max(1);
        let period = Duration::from_millis(u64::try_from(ttl / 3).unwrap_or(1).max(1));
        let tenure = self.clone();
        let k = kernel.clone();
        let s = store.clone();
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let current = tenure.lease();
                match s.renew_lease(&current, k.clock.now_ms(), ttl).await {
                    Ok(renewed) => *tenure.lock() = renewed,
                    // Taken back by this host itself, under a newer tenure
                    // (this drive fell so far behind that its lease expired
                    // and the serve loop claimed the run again): the newer
                    // drive goes on; this one stops (its next commit would
                    // be refused).
                    Err(StoreError::LeaseLost {
                        holder: Some(holder),
                        ..
                    }) if holder.owner == current.owner => {
                        tracing::info!(
                            run = %current.run,
                            epoch = current.epoch,
                            newer = holder.epoch,
                            "this host claimed the run again under a newer tenure; the older drive stops"
                        );
                        scope.cancel_run();
                        return;
                    }
                    // Taken over by another host: every write of this
                    // drive would be refused; interrupt what is in flight.
                    Err(StoreError::LeaseLost {
                        holder: Some(holder),
                        ..
                    }) => {
                        tracing::warn!(
                            run = %current.run,
                            holder = %holder.owner,
                            "lease lost to another host; this host stops driving the run"
                        );
                        scope.cancel_run();
                        return;
                    }
                    // Nobody holds it: the run's last commit ended the
                    // tenure — this host's own (the drive is ending), or an
                    // operator's cancel from anywhere, which this host hears
                    // here and obeys.
                    Err(StoreError::LeaseLost { holder: None, .. }) => {
                        match s.run(&current.run).await {
                            Ok(Some(r)) if r.status == poimen_store::RunStatus::Cancelled => {
                                tracing::info!(run = %current.run, "the run was cancelled elsewhere; this host stops driving it");
                                scope.cancel_run();
                                return;
                            }
                            Ok(_) => return,
                            // Cannot tell yet: ask again at the next beat.
                            Err(e) => tracing::warn!(
                                run = %current.run,
                                "the lease is gone and the run's status could not be read: {e}"
                            ),
                        }
                    }
                    // A store hiccup: try again at the next beat (the lease
                    // holds until it expires).
                    Err(e) => tracing::warn!(run = %current.run, "lease renewal failed: {e}"),
                }
            }
        });
        Holding {
            tenure: self.clone(),
            store,
            heartbeat,
        }
    }
}

/// A held lease: renewed by its heartbeat until [`Holding::release`].
pub(crate) struct Holding {
    tenure: Arc<Tenure>,
    store: Arc<dyn Store>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Holding {
    /// Stops the heartbeat and gives the run up (a no-op in the store if
    /// another host took it over meanwhile).
    pub async fn release(self) {
        self.heartbeat.abort();
        let lease = self.tenure.lease();
        if let Err(e) = self.store.release_lease(&lease).await {
            tracing::warn!(run = %lease.run, "releasing the lease failed (it expires by itself): {e}");
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}
