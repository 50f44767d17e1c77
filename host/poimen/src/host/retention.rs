//! Retention: `poimen gc` deletes what finished runs leave behind.
//!
//! The cutoff is the host clock minus an age — given, or the policy's
//! `[retention] keep-finished-ms`. The store does the rest in one
//! transaction ([`Store::gc`](poimen_store::Store::gc)): runs whose whole
//! tree ended before the cutoff, with their episodes, intents and
//! judgments, and the blobs nothing left refers to. Never a version, never
//! a run that has not ended.

use std::time::Duration;

use poimen_store::GcReport;

use super::{Error, Host};

impl Host {
    /// Deletes runs that finished more than `older_than` ago (the policy's
    /// `[retention] keep-finished-ms` when `None`), or with `dry_run` says
    /// what it would delete. [`Error::NoRetention`] when neither says an age.
    pub async fn gc(&self, older_than: Option<Duration>, dry_run: bool) -> Result<GcReport, Error> {
        let age = older_than
            .or(self.inner.policy.runs().retention.keep_finished)
            .ok_or(Error::NoRetention)?;
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let cutoff = self.inner.clock.now_ms().saturating_sub(age_ms);
        let report = self.inner.store().gc(cutoff, dry_run).await?;
        tracing::info!(
            dry_run,
            cutoff,
            runs = report.runs,
            events = report.events,
            intents = report.intents,
            judgments = report.judgments,
            blobs = report.blobs,
            blob_bytes = report.blob_bytes,
            "gc"
        );
        Ok(report)
    }
}
