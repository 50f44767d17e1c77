//! Wake-ups: a serving host waits for work (`Store::wait_for_work`)
//! instead of sleeping through its poll, and is woken when a write of
//! this process — or, on PostgreSQL, of any host (LISTEN/NOTIFY) — may
//! have made a run claimable.

use std::time::Duration;

use tokio::sync::Notify;

/// One process's doorbell for one store.
#[derive(Debug, Default)]
pub(crate) struct Wakeup {
    bell: Notify,
}

impl Wakeup {
    /// Something may be claimable: wakes a waiter, or the next one to wait
    /// (a ring with no one waiting is kept, once).
    pub fn ring(&self) {
        self.bell.notify_one();
    }

    /// Waits for a ring, at most `within`.
    pub async fn wait(&self, within: Duration) {
        let _ = tokio::time::timeout(within, self.bell.notified()).await;
    }
}
