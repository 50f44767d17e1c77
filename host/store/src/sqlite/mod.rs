//! [`SqliteStore`]: the embedded default store — one SQLite file in WAL mode.
//!
//! This module owns opening a file as a store (refusing what is not one),
//! the connections, and running every operation without stalling the async
//! runtime: on a multi-threaded runtime each call runs in
//! `tokio::task::block_in_place` (the worker hands its other tasks to
//! another thread first), on a current-thread runtime in
//! `tokio::task::spawn_blocking` — so an fsync never holds up other tasks.
//! Writes go through one writer connection behind a mutex
//! (SQLite has one writer at a time anyway); reads go to a small pool of
//! read-only connections, which WAL lets run beside the writer.
//!
//! Durability per write: `PRAGMA synchronous=FULL` for a `Sync` commit (the
//! WAL is fsynced before `commit` returns), `NORMAL` for a `Buffered` one
//! (written to the WAL in order, not fsynced: it survives the process being
//! killed, not the machine losing power, and the next `Sync` commit's fsync
//! covers it). Every other write (publish, blobs, runs, claims) is `Sync`.
//!
//! The SQL itself lives in `ops`, the schema and migrations in `schema`,
//! the mapping of SQLite result codes in `errors`.

mod checkpoint;
mod errors;
mod group;
mod ops;
pub(crate) mod schema;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use poimen_workflow::{VersionPrefix, WorkflowId, WorkflowVersion};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, MAIN_DB, OpenFlags, Transaction, TransactionBehavior};

use self::errors::sql_error;
use self::ops::At;
use self::schema::FileKind;
use crate::error::StoreError;
use crate::ids::{BlobHash, JudgmentId, RunId};
use crate::records::{
    ArmedRecord, Commit, CreateRun, Durability, GcReport, IntentRecord, JudgmentRecord, Lease,
    NewRun, NewVersion, PublishOutcome, RunFilter, RunRecord, RunStatus, StoredEvent,
    VersionRecord, WorkflowSummary,
};
use crate::rules;
use crate::store::{Store, StoreResult};

pub use self::checkpoint::CheckpointStats;
pub use self::group::WriterStats;
pub use self::schema::{APPLICATION_ID, SCHEMA_VERSION};

/// Tuning of a [`SqliteStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How long a write waits for another process's lock before [`StoreError::Busy`].
    pub busy_timeout: Duration,
    /// Read connections beside the writer (0: reads share the writer).
    pub readers: usize,
    /// Cap on the store's size in pages (4 KiB each); a write past it fails
    /// with [`StoreError::Full`], as on a full disk. `None`: no cap.
    pub max_page_count: Option<u64>,
    /// How much of the file's structure `open` checks before it is used.
    pub check: OpenCheck,
    /// The WAL's size in frames (4 KiB each) past what is already in the
    /// database file at which a background thread checkpoints it
    /// (`checkpoint`): no commit pays for a checkpoint. SQLite's own
    /// default, inside the commit that crosses it, is 1000.
    pub checkpoint_pages: u32,
}

/// How much of a store file's structure [`SqliteStore::open_with`] checks.
///
/// Either way SQLite checks every page it reads (`cell_size_check` is on),
/// so a damaged page that a later read reaches is [`StoreError::Corrupt`],
/// never data; and blobs and versions are re-hashed on every read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenCheck {
    /// `PRAGMA quick_check`: the structure of every page and index, before
    /// anything else. Its cost grows with the store (~2 ms a MB). The
    /// default, and what a host that drives runs opens with.
    #[default]
    Full,
    /// The file against its own header: a file shorter than the pages its
    /// header counts (truncated), or not a whole number of pages, is
    /// [`StoreError::Corrupt`]. Constant time: for opens that read what
    /// they need and write nothing of their own (the CLI's reading verbs).
    Header,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            busy_timeout: Duration::from_secs(5),
            readers: 2,
            max_page_count: None,
            check: OpenCheck::Full,
            // ~16 MiB of WAL: a checkpoint (two fsyncs) every ~50 runs of a
            // three-step workflow, 0.04 fsync a run amortized.
            checkpoint_pages: 4000,
        }
    }
}

/// The SQLite [`Store`].
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Arc<Mutex<Writer>>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    /// This process's writes that may have made work.
    wake: crate::wake::Wakeup,
    /// Commits waiting to share the next write transaction (`group`).
    queue: Mutex<group::Queue>,
    stats: group::Stats,
    /// The WAL file, for [`Store::sync`]'s fsync.
    wal: fs::File,
    checkpointer: checkpoint::Checkpointer,
}

struct Writer {
    conn: Connection,
    /// The `synchronous` setting in force on `conn`.
    durability: Durability,
}

impl Writer {
    /// `PRAGMA synchronous` for the next transaction: `FULL` fsyncs the WAL
    /// at commit, `NORMAL` does not.
    fn set_durability(&mut self, p: &Path, durability: Durability) -> StoreResult<()> {
        if self.durability != durability {
            let level = match durability {
                Durability::Sync => "FULL",
                Durability::Buffered => "NORMAL",
            };
            self.conn.pragma_update(None, "synchronous", level).at(p)?;
            self.durability = durability;
        }
        Ok(())
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("readers", &self.inner.readers.len())
            .finish()
    }
}

impl SqliteStore {
    /// Opens the store at `path`, creating it (and its parent directories)
    /// if there is no file there. See [`SqliteStore::open_blocking`].
    pub async fn open(path: impl Into<PathBuf>) -> StoreResult<Self> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// [`SqliteStore::open`] with options.
    pub async fn open_with(path: impl Into<PathBuf>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.into();
        let shown = path.clone();
        join(
            &shown,
            tokio::task::spawn_blocking(move || Self::open_blocking(&path, &options)).await,
        )
    }

    /// Opens the store at `path`, blocking the calling thread.
    ///
    /// Refuses, changing nothing: a directory ([`StoreError::Open`]); an
    /// empty (0-byte), truncated or damaged file ([`StoreError::Corrupt`] —
    /// `PRAGMA quick_check` runs on every open, or the header check of
    /// [`OpenCheck::Header`] where the options ask for it); a file that is not SQLite,
    /// or another application's database ([`StoreError::NotADatabase`]); a
    /// store of a newer schema ([`StoreError::NewerSchema`]); a file or
    /// directory that cannot be written ([`StoreError::ReadOnly`]). An older
    /// store is migrated, in one transaction.
    pub fn open_blocking(path: &Path, options: &SqliteOptions) -> StoreResult<Self> {
        let created = prepare_file(path)?;
        let opened = Self::open_file(path, options);
        if opened.is_err() && created {
            // Leave no empty file behind for the next open to trip on.
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                let _ = fs::remove_file(PathBuf::from(p));
            }
        }
        opened
    }

    fn open_file(path: &Path, options: &SqliteOptions) -> StoreResult<Self> {
        let mut conn = connect(path, options)?;
        if conn.is_readonly(MAIN_DB).at(path)? {
            return Err(StoreError::ReadOnly {
                path: path.to_owned(),
                cause: "the file, or the file system holding it, is not writable".into(),
            });
        }
        if options.check == OpenCheck::Header {
            // Before SQLite reads any page past the header: a truncated
            // file is named as such, not as whatever page SQLite missed.
            schema::header_check(path)?;
        }
        let kind = schema::classify(&conn, path)?;
        if let FileKind::Store(found) = kind {
            // A store about to be migrated is checked in full whatever the
            // options say: the migration rewrites it.
            if options.check == OpenCheck::Full || found < SCHEMA_VERSION {
                schema::quick_check(&conn, path)?;
            }
        }
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .at(path)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open {
                path: path.to_owned(),
                cause: format!("SQLite cannot use WAL mode here (journal mode stays `{mode}`)"),
            });
        }
        conn.pragma_update(None, "synchronous", "FULL").at(path)?;
        schema::migrate(&mut conn, path, schema::MIGRATIONS)?;
        if kind == FileKind::Empty {
            // Move the new schema from the WAL into the main file, so the
            // file alone says "poimen store" from its first second.
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .at(path)?;
        }
        if let Some(pages) = options.max_page_count {
            let pages = i64::try_from(pages).unwrap_or(i64::MAX);
            conn.pragma_update(None, "max_page_count", pages).at(path)?;
        }
        // The writer has the WAL open (WAL mode, and the schema read):
        // SQLite never deletes it while a connection is open.
        let wal = {
            let mut p = path.as_os_str().to_owned();
            p.push("-wal");
            let p = PathBuf::from(p);
            fs::File::open(&p).map_err(|e| io_error(&p, e))?
        };
        let mut readers = Vec::with_capacity(options.readers);
        for _ in 0..options.readers {
            let r = connect(path, options)?;
            r.pragma_update(None, "query_only", true).at(path)?;
            readers.push(Mutex::new(r));
        }
        let writer = Arc::new(Mutex::new(Writer {
            conn,
            durability: Durability::Sync,
        }));
        let checkpointer =
            checkpoint::Checkpointer::start(path, &writer, options.checkpoint_pages)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                writer,
                readers,
                next_reader: AtomicUsize::new(0),
                wake: crate::wake::Wakeup::default(),
                queue: Mutex::default(),
                stats: group::Stats::default(),
                wal,
                checkpointer,
            }),
        })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How many commits this store has written, in how many transactions
    /// (concurrent commits share one: see [`Store::commit`] on this type).
    pub fn writer_stats(&self) -> WriterStats {
        self.inner.stats.get()
    }

    /// The WAL checkpoints the background thread has run so far.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        self.inner.checkpointer.stats()
    }

    /// Runs `f` where it may block. On a multi-threaded runtime that is the
    /// calling thread, through `block_in_place`: the worker first hands its
    /// other tasks to another thread, so they keep running, and the caller
    /// pays no hop to the blocking pool and back (two cross-thread wake-ups
    /// per commit, ~40–70 µs of a durable tool step's ~150 µs of non-fsync
    /// commit cost on a 2-vCPU VM; BENCHMARKS.md). Elsewhere (a
    /// current-thread runtime, where `block_in_place` is not allowed) it is
    /// the blocking pool; outside any runtime, the calling thread.
    async fn blocking<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> StoreResult<T> + Send + 'static,
    {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::CurrentThread) => {
                let inner = Arc::clone(&self.inner);
                join(
                    &self.inner.path,
                    tokio::task::spawn_blocking(move || f(&inner)).await,
                )
            }
            Ok(_) => tokio::task::block_in_place(|| f(&self.inner)),
            Err(_) => f(&self.inner),
        }
    }

    async fn write<T, F>(&self, durability: Durability, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>, &Path) -> StoreResult<T> + Send + 'static,
    {
        self.blocking(move |inner| inner.write(durability, f)).await
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Path) -> StoreResult<T> + Send + 'static,
    {
        self.blocking(move |inner| inner.read(f)).await
    }
}

/// The result of a blocking task: a panic inside it is re-raised here.
fn join<T>(path: &Path, r: Result<StoreResult<T>, tokio::task::JoinError>) -> StoreResult<T> {
    match r {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::Io {
            path: path.to_owned(),
            detail: "the store's worker task was cancelled (the runtime is shutting down)".into(),
        }),
    }
}

impl Inner {
    fn write<T>(
        &self,
        durability: Durability,
        f: impl FnOnce(&Transaction<'_>, &Path) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let p = self.path.as_path();
        // A panic while the lock was held unwound through the transaction's
        // drop, which rolled it back: the connection is usable.
        let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        w.set_durability(p, durability)?;
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(p)?;
        let out = f(&tx, p)?; // an error drops `tx`: rolled back
        tx.commit().at(p)?;
        Ok(out)
    }

    fn read<T>(&self, f: impl FnOnce(&Connection, &Path) -> StoreResult<T>) -> StoreResult<T> {
        let p = self.path.as_path();
        if self.readers.is_empty() {
            let w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            return f(&w.conn, p);
        }
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let n = self.readers.len();
        // Take an idle reader if there is one, else wait for the next in turn.
        for k in 0..n {
            if let Ok(conn) = self.readers[(start + k) % n].try_lock() {
                return f(&conn, p);
            }
        }
        let conn = self.readers[start % n]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&conn, p)
    }
}

/// Checks what is at `path` before SQLite sees it; creates the parent
/// directories and an empty file when nothing is there. Returns whether it
/// created the file.
fn prepare_file(path: &Path) -> StoreResult<bool> {
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(StoreError::Open {
            path: path.to_owned(),
            cause: "it is a directory; give the path of the store file (e.g. .poimen/poimen.db)"
                .into(),
        }),
        // SQLite would take an empty file for a new database. A store always
        // has at least one page, so an empty file is a store that lost its
        // content (or a creation that crashed): never open it as empty.
        Ok(m) if m.len() == 0 => Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: "the file is empty (0 bytes), and a store always has at least one page; \
                     if poimen crashed while creating it, delete the file"
                .into(),
        }),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|d| !d.as_os_str().is_empty());
            // The directories whose entries change: up to the first that exists.
            let mut changed = Vec::new();
            let mut dir = parent;
            while let Some(d) = dir {
                changed.push(d.to_owned());
                if d.exists() {
                    break;
                }
                dir = d.parent().filter(|d| !d.as_os_str().is_empty());
            }
            if let Some(dir) = parent {
                fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
            }
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
            {
                Ok(_) => {
                    // SQLite syncs the directory when it creates the WAL, not
                    // when it opens the main file we made: without this, a
                    // power loss soon after creation could lose the file's
                    // name, and with it every commit since.
                    for d in &changed {
                        sync_dir(d)?;
                    }
                    Ok(true)
                }
                // Another process is creating it right now: SQLite's locks
                // and the migration's write transaction order the two.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(io_error(path, e)),
            }
        }
        Err(e) => Err(io_error(path, e)),
    }
}

/// fsync of a directory, so the names it holds are durable.
fn sync_dir(dir: &Path) -> StoreResult<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::Io {
            path: dir.to_owned(),
            detail: format!("cannot sync the directory: {e}"),
        })
}

pub(crate) fn io_error(path: &Path, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::ReadOnlyFilesystem | io::ErrorKind::PermissionDenied => {
            StoreError::ReadOnly {
                path: path.to_owned(),
                cause: e.to_string(),
            }
        }
        io::ErrorKind::StorageFull => StoreError::Full {
            path: path.to_owned(),
        },
        _ => StoreError::Open {
            path: path.to_owned(),
            cause: e.to_string(),
        },
    }
}

/// A connection to an existing file, configured the same way for the writer
/// and the readers.
fn connect(path: &Path, options: &SqliteOptions) -> StoreResult<Connection> {
    // No SQLITE_OPEN_CREATE: `prepare_file` decided whether a file may be
    // created. No SQLITE_OPEN_URI: a path is a path.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| sql_error(path, e))?;
    conn.busy_timeout(options.busy_timeout).at(path)?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "foreign_keys", true).at(path)?;
    // The schema of a file we did not write is not trusted to call
    // functions with side effects.
    conn.pragma_update(None, "trusted_schema", false).at(path)?;
    conn.pragma_update(None, "cell_size_check", true).at(path)?;
    // Query plans fixed at prepare time. Without this, SQLite marks some
    // bound parameters "re-plan when rebound", and the statement cache's
    // clearing of bindings then re-prepares those statements on every use:
    // measured, it more than doubled the CPU cost of a commit. The store
    // never runs ANALYZE, so no plan depends on bound values anyway.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .at(path)?;
    Ok(conn)
}

#[async_trait]
impl Store for SqliteStore {
    async fn publish_version(&self, new: NewVersion) -> StoreResult<PublishOutcome> {
        rules::check_version_hash(&new)?;
        self.write(Durability::Sync, move |tx, p| {
            ops::publish_version(tx, p, new)
        })
        .await
    }

    async fn version(&self, version: &WorkflowVersion) -> StoreResult<Option<VersionRecord>> {
        let v = *version;
        self.read(move |c, p| ops::version(c, p, &v)).await
    }

    async fn resolve_version_prefix(&self, prefix: &VersionPrefix) -> StoreResult<WorkflowVersion> {
        let prefix = prefix.clone();
        self.read(move |c, p| ops::resolve_prefix(c, p, &prefix))
            .await
    }

    async fn versions_of(&self, workflow: &WorkflowId) -> StoreResult<Vec<VersionRecord>> {
        let w = workflow.clone();
        self.read(move |c, p| ops::versions_of(c, p, &w)).await
    }

    async fn latest_version(&self, workflow: &WorkflowId) -> StoreResult<Option<VersionRecord>> {
        let w = workflow.clone();
        self.read(move |c, p| ops::latest_version(c, p, &w)).await
    }

    async fn workflows(&self) -> StoreResult<Vec<WorkflowSummary>> {
        self.read(ops::workflows).await
    }

    async fn put_blob(&self, bytes: Vec<u8>) -> StoreResult<BlobHash> {
        self.write(Durability::Sync, move |tx, p| ops::put_blob(tx, p, &bytes))
            .await
    }

    async fn blob(&self, hash: &BlobHash) -> StoreResult<Option<Vec<u8>>> {
        let h = *hash;
        self.read(move |c, p| ops::blob(c, p, &h)).await
    }

    /// A run created with a lease is written without an fsync: only its
    /// creator knows of it until the creator commits the run's start, and
    /// the next fsync of the WAL (which is written in order) makes the
    /// creation durable before anything after it. A crash of the machine
    /// before then loses a run nobody else has seen. A run created without
    /// one (any host may claim it) is fsynced before this returns.
    async fn create_run(&self, new: NewRun) -> StoreResult<CreateRun> {
        let durability = if new.lease.is_some() {
            Durability::Buffered
        } else {
            Durability::Sync
        };
        let created = self
            .write(durability, move |tx, p| ops::create_run(tx, p, new))
            .await?;
        if let CreateRun::Created(r) = &created
            && r.lease.is_none()
        {
            self.inner.wake.ring();
        }
        Ok(created)
    }

    async fn run(&self, id: &RunId) -> StoreResult<Option<RunRecord>> {
        let id = id.clone();
        self.read(move |c, p| ops::run(c, p, &id)).await
    }

    async fn list_runs(&self, filter: RunFilter) -> StoreResult<Vec<RunRecord>> {
        self.read(move |c, p| ops::list_runs(c, p, &filter)).await
    }

    async fn count_runs(&self, filter: RunFilter) -> StoreResult<Vec<(RunStatus, u64)>> {
        self.read(move |c, p| ops::count_runs(c, p, &filter)).await
    }

    async fn children(&self, parent: &RunId) -> StoreResult<Vec<RunRecord>> {
        let id = parent.clone();
        self.read(move |c, p| ops::children(c, p, &id)).await
    }

    /// Concurrent commits share one transaction and one fsync (group
    /// commit; see the `group` module): each caller still hears `Ok` only
    /// once its own commit is stored with its durability, and a refused
    /// commit is refused alone.
    async fn commit(&self, commit: Commit) -> StoreResult<()> {
        rules::check_commit_shape(&commit)?;
        let work = rules::may_make_work(&commit);
        let (answer, lead) = self.inner.enqueue(commit);
        if lead {
            let inner = Arc::clone(&self.inner);
            self.blocking(move |_| {
                inner.lead();
                Ok(())
            })
            .await?;
        }
        answer
            .await
            .unwrap_or_else(|_| Err(group::answer_lost(&self.inner.path)))?;
        if work {
            self.inner.wake.ring();
        }
        Ok(())
    }

    async fn events(&self, run: &RunId) -> StoreResult<Vec<StoredEvent>> {
        let id = run.clone();
        self.read(move |c, p| ops::events(c, p, &id, None)).await
    }

    async fn events_after(&self, run: &RunId, seq: u64) -> StoreResult<Vec<StoredEvent>> {
        let id = run.clone();
        self.read(move |c, p| ops::events(c, p, &id, Some(seq)))
            .await
    }

    async fn intents(&self, run: &RunId) -> StoreResult<Vec<IntentRecord>> {
        let id = run.clone();
        self.read(move |c, p| ops::intents(c, p, &id)).await
    }

    async fn judgment(&self, id: &JudgmentId) -> StoreResult<Option<JudgmentRecord>> {
        let id = id.clone();
        self.read(move |c, p| ops::judgment(c, p, &id)).await
    }

    async fn open_judgments(&self) -> StoreResult<Vec<JudgmentRecord>> {
        self.read(ops::open_judgments).await
    }

    async fn claim_run(
        &self,
        run: &RunId,
        owner: &str,
        now: i64,
        ttl_ms: i64,
    ) -> StoreResult<Option<Lease>> {
        let (id, owner) = (run.clone(), owner.to_owned());
        self.write(Durability::Sync, move |tx, p| {
            ops::claim_run(tx, p, &id, &owner, now, ttl_ms)
        })
        .await
    }

    async fn claim_runnable(
        &self,
        owner: &str,
        now: i64,
        ttl_ms: i64,
        limit: u32,
    ) -> StoreResult<Vec<(RunRecord, Lease)>> {
        let owner = owner.to_owned();
        self.write(Durability::Sync, move |tx, p| {
            ops::claim_runnable(tx, p, &owner, now, ttl_ms, limit)
        })
        .await
    }

    async fn renew_lease(&self, lease: &Lease, now: i64, ttl_ms: i64) -> StoreResult<Lease> {
        let lease = lease.clone();
        self.write(Durability::Sync, move |tx, p| {
            ops::renew_lease(tx, p, &lease, now, ttl_ms)
        })
        .await
    }

    /// Written without an fsync: a release lost to a crash of the machine
    /// only leaves the lease to expire (a terminal run's lease holds
    /// nothing; another host takes a run it held over once it expires).
    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let lease = lease.clone();
        self.write(Durability::Buffered, move |tx, p| {
            ops::release_lease(tx, p, &lease)
        })
        .await?;
        self.inner.wake.ring();
        Ok(())
    }

    async fn wait_for_work(&self, within: std::time::Duration) {
        self.inner.wake.wait(within).await;
    }

    /// One fdatasync of the WAL: every frame of every commit returned so
    /// far was written to it before the commit returned, so after it they
    /// are on disk, as a `FULL` commit's own fsync would have put them (a
    /// frame a checkpoint has since backfilled and the writer overwritten
    /// is in the database file, which the checkpoint fsynced first). No
    /// lock: a write transaction never waits for it.
    async fn sync(&self) -> StoreResult<()> {
        self.blocking(|inner| {
            inner.wal.sync_data().map_err(|e| {
                let mut p = inner.path.as_os_str().to_owned();
                p.push("-wal");
                io_error(Path::new(&p), e)
            })
        })
        .await
    }

    async fn runs_owned_by(&self, owner: &str) -> StoreResult<Vec<RunRecord>> {
        let owner = owner.to_owned();
        self.read(move |c, p| ops::runs_owned_by(c, p, &owner))
            .await
    }

    async fn in_flight_runs(&self) -> StoreResult<Vec<RunRecord>> {
        self.read(ops::in_flight_runs).await
    }

    async fn set_wake(&self, run: &RunId, at: Option<i64>) -> StoreResult<()> {
        let run = run.clone();
        self.write(Durability::Sync, move |tx, p| {
            ops::set_wake(tx, p, &run, at)
        })
        .await?;
        // A timer may now be due sooner than a serving host's poll.
        self.inner.wake.ring();
        Ok(())
    }

    async fn next_wake(&self) -> StoreResult<Option<i64>> {
        self.read(ops::next_wake).await
    }

    async fn arm(
        &self,
        workflow: &WorkflowId,
        version: Option<&WorkflowVersion>,
        at: i64,
    ) -> StoreResult<Option<ArmedRecord>> {
        let (w, v) = (workflow.clone(), version.copied());
        self.write(Durability::Sync, move |tx, p| {
            ops::arm(tx, p, &w, v.as_ref(), at)
        })
        .await
    }

    async fn armed(&self, workflow: &WorkflowId) -> StoreResult<Option<ArmedRecord>> {
        let w = workflow.clone();
        self.read(move |c, p| ops::armed(c, p, &w)).await
    }

    async fn set_unload_deadline(
        &self,
        version: &WorkflowVersion,
        deadline: i64,
        at: i64,
    ) -> StoreResult<()> {
        let v = *version;
        self.write(Durability::Sync, move |tx, p| {
            ops::set_unload_deadline(tx, p, &v, deadline, at)
        })
        .await
    }

    async fn unload_deadline(&self, version: &WorkflowVersion) -> StoreResult<Option<i64>> {
        let v = *version;
        self.read(move |c, p| ops::unload_deadline(c, p, &v)).await
    }

    async fn gc(&self, finished_before: i64, dry_run: bool) -> StoreResult<GcReport> {
        self.write(Durability::Sync, move |tx, p| {
            ops::gc(tx, p, finished_before, dry_run)
        })
        .await
    }
}

#[cfg(test)]
mod tests;
