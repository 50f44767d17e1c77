//! WAL checkpoints off the committing run's path.
//!
//! SQLite's own auto-checkpoint runs inside the commit that crosses its
//! threshold (1000 frames): that commit pays for fsyncing the WAL, copying
//! the pages into the database file and fsyncing that too — two fsyncs and
//! a burst of writes on one run's critical path, every ~12 runs of a
//! three-step workflow (~81 frames a run), 0.15 fsync a run amortized.
//!
//! Here the writer's WAL hook (called after each commit with the WAL's
//! size in frames) only compares that size with what was last backfilled;
//! past [`SqliteOptions::checkpoint_pages`](super::SqliteOptions) frames it
//! wakes a thread that checkpoints once the commit has returned. The thread
//! holds the writer's lock while it does: a checkpoint beside a writer that
//! keeps appending never backfills the WAL whole, and SQLite restarts the
//! WAL from its start only at the first write after one that did — measured,
//! a WAL checkpointed passively beside a busy writer grew without bound. So
//! a commit that arrives meanwhile waits (and shares its transaction with
//! any others that arrive, `group`); the commit that crossed the threshold
//! never does. With a threshold of thousands of frames that is one
//! checkpoint in tens of runs.
//!
//! Durability is not the checkpoint's business: a commit is durable by its
//! own fsync (`synchronous=FULL`) or by [`Store::sync`](crate::Store::sync)'s
//! fsync of the WAL; a checkpoint only moves what the WAL already holds.

use std::ffi::c_int;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;

use super::Writer;
use super::ops::At;
use crate::store::StoreResult;

/// The background checkpointer of one store: its thread and what it shares
/// with the writer's WAL hook. Dropping it stops the thread and waits for
/// it (after any checkpoint under way).
pub(super) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// A checkpoint is asked for and not yet begun.
    pending: bool,
    /// The store is closing: the thread ends.
    closed: bool,
    /// Frames of the current WAL known backfilled into the database file.
    backfilled: i64,
    stats: CheckpointStats,
}

/// What a store's background checkpointer has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints run.
    pub checkpoints: u64,
    /// Checkpoints that could not backfill the whole WAL (a reader of
    /// another process held an older snapshot): the WAL was not restarted.
    pub partial: u64,
    /// Checkpoints that failed, and the last error (the next may succeed:
    /// a checkpoint changes nothing a commit relies on).
    pub failures: u64,
    pub last_error: Option<String>,
}

impl Checkpointer {
    /// Installs the hook on `writer`'s connection and starts the thread.
    /// `pages`: the WAL's size in frames, past what is backfilled, at which
    /// a checkpoint is asked for.
    pub(super) fn start(path: &Path, writer: &Arc<Mutex<Writer>>, pages: u32) -> StoreResult<Self> {
        let shared = Arc::new(Shared::default());
        let threshold = i64::from(pages.max(1));
        let hook = Arc::clone(&shared);
        // Installing a WAL hook replaces SQLite's auto-checkpoint.
        writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .conn
            .wal_hook(Some(move |_: &mut Wal, frames: c_int| {
                hook.after_commit(i64::from(frames), threshold);
                Ok(())
            }))
            .at(path)?;
        let run = Arc::clone(&shared);
        let writer = Arc::clone(writer);
        let thread = std::thread::Builder::new()
            .name("poimen-sqlite-checkpoint".into())
            .spawn(move || run.serve(&writer))
            .map_err(|e| crate::StoreError::Io {
                path: path.to_owned(),
                detail: format!("cannot start the store's checkpoint thread: {e}"),
            })?;
        Ok(Checkpointer {
            shared,
            thread: Some(thread),
        })
    }

    pub(super) fn stats(&self) -> CheckpointStats {
        self.shared.lock().stats.clone()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer's WAL hook: `frames` is the WAL's size after a commit.
    fn after_commit(&self, frames: i64, threshold: i64) {
        let mut s = self.lock();
        if frames < s.backfilled {
            // The writer restarted the WAL from its start.
            s.backfilled = 0;
        }
        if frames - s.backfilled >= threshold && !s.pending {
            s.pending = true;
            drop(s);
            self.wake.notify_one();
        }
    }

    /// The thread: one checkpoint per request, under the writer's lock,
    /// until closed.
    fn serve(&self, writer: &Mutex<Writer>) {
        loop {
            let mut s = self.lock();
            while !s.pending && !s.closed {
                s = self.wake.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            if s.closed {
                return;
            }
            s.pending = false;
            drop(s);
            let done = writer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .conn
                .wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE);
            let mut s = self.lock();
            s.stats.checkpoints += 1;
            match done {
                Ok((log, backfilled)) if backfilled >= 0 => {
                    s.backfilled = s.backfilled.max(i64::from(backfilled));
                    if backfilled < log {
                        s.stats.partial += 1;
                    }
                }
                Ok(_) => {
                    s.stats.failures += 1;
                    s.stats.last_error = Some("SQLite ran no checkpoint (no WAL)".into());
                }
                Err(e) => {
                    s.stats.failures += 1;
                    s.stats.last_error = Some(e.to_string());
                }
            }
        }
    }
}
