//! Group commit: the commits of concurrent runs that are ready together
//! share one SQLite transaction and one fsync.
//!
//! A caller queues its [`Commit`] and waits for its own answer. If no
//! writer is leading, the caller leads: it takes everything queued (its own
//! commit first) and writes it as one batch, on its own thread — with no
//! one else waiting, that is exactly the single-commit path, with no hop to
//! another thread. Commits that arrive while a batch is being written (most
//! of a batch's time is its fsync) queue, and when the batch is done the
//! leader hands the queue to a blocking-pool thread, which writes batches
//! until the queue is empty. So the leader's own run never waits for
//! others' batches, and under load one fsync covers every commit that was
//! ready during the previous one.
//!
//! Guarantees are the single commit's: a caller hears `Ok` only once its
//! commit is in a committed transaction, fsynced when the batch holds any
//! `Sync` commit — an effect still waits for its own intent to be durable.
//! Each commit runs inside its own savepoint, so one that is refused (a
//! sequence conflict, a lost lease, …) is rolled back alone and its caller
//! gets that error, while the others commit; a later commit of the same
//! batch sees the earlier ones, exactly as if they had been written one
//! after the other in queue order. If the batch's transaction itself fails
//! (the disk is full, another process holds the lock too long, SQLite
//! rolled the transaction back), nothing of it stays, and every commit of
//! the batch is written again in a transaction of its own, so each caller
//! gets its own commit's answer.

use std::sync::{Arc, MutexGuard, PoisonError};

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::ops::{self, At};
use super::{Inner, Writer};
use crate::error::StoreError;
use crate::records::{Commit, Durability};
use crate::store::StoreResult;

/// The most commits one transaction takes; the rest wait for the next.
const MAX_BATCH: usize = 256;

/// Commits waiting to be written, and whether a writer is on them.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) items: Vec<Queued>,
    pub(super) leading: bool,
}

pub(super) struct Queued {
    commit: Commit,
    done: oneshot::Sender<StoreResult<()>>,
}

/// How a store's writes went, for tests and benchmarks: how many commits
/// were written in how many transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// [`Store::commit`](crate::Store::commit) calls answered.
    pub commits: u64,
    /// Committed write transactions that held them (fewer than `commits`
    /// when concurrent commits shared one).
    pub transactions: u64,
}

impl Inner {
    /// Queues `commit`; returns the receiver of its answer, and whether the
    /// caller is to lead (call [`Inner::lead`]).
    pub(super) fn enqueue(&self, commit: Commit) -> (oneshot::Receiver<StoreResult<()>>, bool) {
        let (done, rx) = oneshot::channel();
        let mut q = self.queue();
        q.items.push(Queued { commit, done });
        let lead = !q.leading;
        q.leading = true;
        (rx, lead)
    }

    /// Writes one batch (which holds the leader's own commit: it queued
    /// before it led, and no one else takes from the queue while a writer
    /// leads), then hands what queued meanwhile to a blocking-pool thread.
    pub(super) fn lead(self: &Arc<Self>) {
        let _unwinding = Leading(self);
        let batch = self.take();
        self.write_batch(batch);
        let more = {
            let mut q = self.queue();
            q.leading = !q.items.is_empty();
            q.leading
        };
        if more {
            let handoff = Handoff(Some(Arc::clone(self)));
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    h.spawn_blocking(move || handoff.run());
                }
                Err(_) => handoff.run(),
            }
        }
    }

    /// Writes batches until the queue is empty, then stops leading.
    fn drain(&self) {
        let _unwinding = Leading(self);
        loop {
            let batch = {
                let mut q = self.queue();
                if q.items.is_empty() {
                    q.leading = false;
                    return;
                }
                take_from(&mut q)
            };
            self.write_batch(batch);
        }
    }

    fn take(&self) -> Vec<Queued> {
        take_from(&mut self.queue())
    }

    pub(super) fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `batch` and answers each of its callers.
    fn write_batch(&self, mut batch: Vec<Queued>) {
        if batch.is_empty() {
            return;
        }
        self.stats.add(batch.len());
        if batch.len() == 1 {
            let q = batch.remove(0);
            let r = self.write_one(&q.commit);
            let _ = q.done.send(r);
            return;
        }
        let durability = if batch
            .iter()
            .any(|q| q.commit.durability == Durability::Sync)
        {
            Durability::Sync
        } else {
            Durability::Buffered
        };
        let together = {
            let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            self.write_together(&mut w, durability, &batch)
        };
        match together {
            Ok(results) => {
                for (q, r) in batch.into_iter().zip(results) {
                    let _ = q.done.send(r);
                }
            }
            Err(e) => {
                tracing::debug!(
                    commits = batch.len(),
                    error = %e,
                    "a group commit failed as a whole; writing its commits one by one"
                );
                // Counted: one transaction per commit (the undone one not).
                self.stats.add_transactions(batch.len().saturating_sub(1));
                for q in batch {
                    let r = self.write_one(&q.commit);
                    let _ = q.done.send(r);
                }
            }
        }
    }

    fn write_one(&self, commit: &Commit) -> StoreResult<()> {
        self.write(commit.durability, |tx, p| ops::commit(tx, p, commit))
    }

    /// The batch in one transaction, each commit in a savepoint: the
    /// answer of each, or the error that undid the whole transaction.
    fn write_together(
        &self,
        w: &mut Writer,
        durability: Durability,
        batch: &[Queued],
    ) -> StoreResult<Vec<StoreResult<()>>> {
        let p = self.path.as_path();
        w.set_durability(p, durability)?;
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(p)?;
        let mut results = Vec::with_capacity(batch.len());
        for q in batch {
            exec(&tx, "SAVEPOINT poimen_commit").at(p)?;
            match ops::commit(&tx, p, &q.commit) {
                Ok(()) => {
                    exec(&tx, "RELEASE poimen_commit").at(p)?;
                }
                Err(e) => {
                    if tx.is_autocommit() {
                        // SQLite rolled the whole transaction back (an I/O
                        // error, a full disk): nothing of the batch stays.
                        return Err(e);
                    }
                    exec(&tx, "ROLLBACK TO poimen_commit").at(p)?;
                    exec(&tx, "RELEASE poimen_commit").at(p)?;
                    results.push(Err(e));
                    continue;
                }
            }
            results.push(Ok(()));
        }
        tx.commit().at(p)?;
        Ok(results)
    }
}

fn exec(c: &Connection, sql: &str) -> rusqlite::Result<usize> {
    c.prepare_cached(sql)?.execute([])
}

fn take_from(q: &mut Queue) -> Vec<Queued> {
    if q.items.len() <= MAX_BATCH {
        std::mem::take(&mut q.items)
    } else {
        q.items.drain(..MAX_BATCH).collect()
    }
}

/// Held by the thread that leads: if it unwinds (a bug panicked in the
/// middle of a batch), leading stops and what is queued is dropped, so its
/// callers hear an error ([`answer_lost`]) instead of waiting forever, and
/// the next commit leads. The batch's own callers hear the same: their
/// answer's sender was dropped with the batch.
struct Leading<'a>(&'a Inner);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut q = self.0.queue();
            q.leading = false;
            q.items.clear();
        }
    }
}

/// The queue handed to a blocking-pool thread. If the thread never runs
/// it (the runtime is shutting down and drops the task), dropping this
/// stops leading and answers what is queued with [`answer_lost`], so no
/// later commit on this store waits for a writer that will never come.
struct Handoff(Option<Arc<Inner>>);

impl Handoff {
    fn run(mut self) {
        if let Some(inner) = self.0.take() {
            inner.drain();
        }
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            let mut q = inner.queue();
            q.leading = false;
            q.items.clear();
        }
    }
}

/// Counters behind [`WriterStats`].
#[derive(Default)]
pub(super) struct Stats {
    commits: std::sync::atomic::AtomicU64,
    transactions: std::sync::atomic::AtomicU64,
}

impl Stats {
    fn add(&self, commits: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commits.fetch_add(commits as u64, Relaxed);
        self.transactions.fetch_add(1, Relaxed);
    }

    fn add_transactions(&self, n: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.transactions.fetch_add(n as u64, Relaxed);
    }

    pub(super) fn get(&self) -> WriterStats {
        use std::sync::atomic::Ordering::Relaxed;
        WriterStats {
            commits: self.commits.load(Relaxed),
            transactions: self.transactions.load(Relaxed),
        }
    }
}

/// The store's error for a caller whose answer was lost (the writer
/// panicked, or the runtime shut down while the batch was queued).
pub(super) fn answer_lost(path: &std::path::Path) -> StoreError {
    StoreError::Io {
        path: path.to_owned(),
        detail: "the store's writer stopped before answering this commit \
                 (it panicked, or the runtime is shutting down); the commit \
                 may or may not be stored — read the run's episode"
            .into(),
    }
}
