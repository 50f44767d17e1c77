//! [`StoreError`]: every way a store operation fails, each with a message
//! that says what happened, where, and what to do.
//!
//! Backends map their own failures (SQLite result codes, PostgreSQL
//! SQLSTATEs, IO and connection errors) into these variants; callers match
//! on the variant, never on message text. This module does not know which
//! backend produced an error beyond the `path` it names: a file path,
//! `:memory:` for the in-memory store, or the URL of a PostgreSQL store with
//! its password redacted.

use std::fmt;
use std::path::PathBuf;

use poimen_workflow::{StepId, VersionPrefix, WorkflowId, WorkflowVersion};

use crate::ids::{BlobHash, JudgmentId, RunId};
use crate::records::{Fence, IntentPhase, Lease, RunStatus};

/// A failed store operation.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The store file could not be opened or created.
    Open { path: PathBuf, cause: String },
    /// The file is not a poimen store (not SQLite, or another application's database).
    NotADatabase { path: PathBuf, detail: String },
    /// The file is damaged: truncated, failing SQLite's integrity check, or
    /// holding bytes that do not match their content hash.
    Corrupt { path: PathBuf, detail: String },
    /// The store was written by a newer poimen.
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// Upgrading the schema failed; the store was left at its old version.
    Migration {
        path: PathBuf,
        version: u32,
        cause: String,
    },
    /// The version claimed for a publish is not the hash of its bytes.
    VersionHashMismatch {
        claimed: WorkflowVersion,
        actual: WorkflowVersion,
    },
    /// Different content under a version already stored: corruption or a bug.
    VersionConflict {
        version: WorkflowVersion,
        detail: String,
    },
    /// The parent of a new version is not stored.
    UnknownParent { parent: WorkflowVersion },
    /// The parent of a new version belongs to another workflow id.
    ParentOfOtherWorkflow {
        parent: WorkflowVersion,
        parent_workflow: WorkflowId,
        workflow: WorkflowId,
    },
    /// A version to arm belongs to another workflow id.
    ArmOtherWorkflow {
        version: WorkflowVersion,
        its_workflow: WorkflowId,
        workflow: WorkflowId,
    },
    /// Something named does not exist (`what` names it: "run WFR-…").
    NotFound { what: String },
    /// A version prefix matches more than one stored version.
    AmbiguousPrefix {
        prefix: VersionPrefix,
        candidates: Vec<WorkflowVersion>,
    },
    /// An idempotency key is already used by a run of another version or
    /// input. (Boxed: it is the largest variant, and every `Result` carrying
    /// a `StoreError` would pay for its size.)
    IdempotencyConflict(Box<IdempotencyConflict>),
    /// A run id is already used by a different run.
    RunIdConflict { id: RunId },
    /// A child run names another tenant than its parent run's: a run's
    /// sub-workflows belong to the run's tenant.
    TenantMismatch {
        /// The child run refused.
        run: RunId,
        /// The tenant the child named.
        tenant: String,
        /// Its parent run.
        parent: RunId,
        /// The parent's tenant.
        parent_tenant: String,
    },
    /// A commit's events do not continue the run's episode: another writer
    /// got there first, or the caller lost count.
    SequenceConflict { run: RunId, expected: u64, got: u64 },
    /// An intent phase that the protocol does not allow after the previous one.
    IntentOutOfOrder {
        run: RunId,
        step: StepId,
        iteration: u32,
        attempt: u32,
        phase: IntentPhase,
        previous: Option<IntentPhase>,
    },
    /// A judgment request opened twice, answered twice, or answered through another run.
    JudgmentConflict { id: JudgmentId, detail: String },
    /// A completed or cancelled run cannot change status or output.
    RunFinal { run: RunId, status: RunStatus },
    /// A fenced write (a commit, or a lease renewal) by a host that no
    /// longer holds the run: another host took it over (a new tenure, with
    /// a larger epoch), or the lease was released. Nothing was written.
    LeaseLost {
        run: RunId,
        /// The owner and epoch the write claimed.
        fence: Fence,
        /// The run's lease now (`None`: no host holds it).
        holder: Option<Lease>,
    },
    /// A new run of an admission group that refuses when full
    /// (`on_overflow: drop`) found `max_runs` runs of the group not yet
    /// ended. Nothing was written.
    AdmissionFull {
        group: String,
        max_runs: u32,
        /// The runs that fill the group, oldest first.
        active: Vec<RunId>,
    },
    /// A commit that is malformed on its face (an intent of another run, …).
    InvalidCommit { run: RunId, detail: String },
    /// The store file or its directory cannot be written.
    ReadOnly { path: PathBuf, cause: String },
    /// The disk (or the store's size limit) is full.
    Full { path: PathBuf },
    /// Another process held the store's lock for longer than the busy timeout.
    Busy { path: PathBuf },
    /// The operating system reported an IO error.
    Io { path: PathBuf, detail: String },
    /// Any other SQLite failure.
    Sqlite {
        path: PathBuf,
        code: i32,
        message: String,
    },
    /// The PostgreSQL server cannot be reached, or the connection broke
    /// (refused, timed out, reset, the server shutting down). A write under
    /// way when it broke may or may not have been committed.
    Unavailable {
        /// The store's URL, its password replaced by `***`.
        url_redacted: String,
        source_message: String,
    },
    /// The PostgreSQL server refused the connection's credentials: an
    /// unknown role, a wrong password, no right to connect or to write.
    AccessDenied {
        url_redacted: String,
        source_message: String,
    },
    /// Any other PostgreSQL failure, with its SQLSTATE.
    Postgres {
        url_redacted: String,
        code: String,
        message: String,
    },
    /// A store URL whose scheme no backend of this build opens.
    UnsupportedUrl {
        url_redacted: String,
        scheme: String,
        /// What this build accepts (`postgres://…`, `sqlite://PATH`, …).
        accepted: Vec<String>,
    },
}

/// The details of [`StoreError::IdempotencyConflict`]: both runs' versions,
/// input hashes and tenants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyConflict {
    pub key: String,
    pub existing_run: RunId,
    pub existing_version: WorkflowVersion,
    pub new_version: WorkflowVersion,
    pub existing_input_hash: BlobHash,
    pub new_input_hash: BlobHash,
    /// Keys are global to the store: the run a key names may belong to
    /// another tenant than the request's.
    pub existing_tenant: String,
    pub new_tenant: String,
}

impl std::fmt::Display for IdempotencyConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let IdempotencyConflict {
            key,
            existing_run,
            existing_version,
            new_version,
            existing_input_hash,
            new_input_hash,
            existing_tenant,
            new_tenant,
        } = self;
        let other_tenant = existing_tenant != new_tenant;
        write!(
            f,
            "idempotency key `{key}` already names run {existing_run} with input {existing_input_hash}"
        )?;
        if existing_version != new_version {
            write!(f, " of version {existing_version}")?;
        }
        if other_tenant {
            write!(f, " of tenant `{existing_tenant}`")?;
        }
        write!(f, "; this request has input {new_input_hash}")?;
        if existing_version != new_version {
            write!(f, " of version {new_version}")?;
        }
        if other_tenant {
            write!(
                f,
                " of tenant `{new_tenant}`. Idempotency keys are global to the store, not per tenant: use a key no other tenant uses"
            )
        } else {
            write!(
                f,
                ". Use a new key for a different request, or resend the same input"
            )
        }
    }
}

impl std::error::Error for IdempotencyConflict {}

impl StoreError {
    /// The store could not do its work for a reason outside the request —
    /// read-only, full, locked, IO. The caller should stop the step as
    /// blocked or failed with this cause, never report success; retrying
    /// later may work.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::ReadOnly { .. }
                | StoreError::Full { .. }
                | StoreError::Busy { .. }
                | StoreError::Io { .. }
                | StoreError::Unavailable { .. }
        )
    }

    /// The stored data is damaged.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StoreError::NotADatabase { .. }
                | StoreError::Corrupt { .. }
                | StoreError::VersionConflict { .. }
        )
    }

    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        StoreError::NotFound { what: what.into() }
    }
}

/// Whether `path` names a database server (a URL) rather than a file.
fn is_server(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(|s| s.contains("://"))
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Open { path, cause } if is_server(path) => write!(
                f,
                "cannot open the store at {}: {cause}. Check the URL (server, port, database name), or choose another store",
                path.display()
            ),
            StoreError::Open { path, cause } => write!(
                f,
                "cannot open the store at {}: {cause}. Check the path, or choose another with --store or POIMEN_HOME",
                path.display()
            ),
            StoreError::NotADatabase { path, detail } => write!(
                f,
                "{} is not a poimen store ({detail}). Nothing was changed; point --store or POIMEN_HOME at a poimen store, or move this file away",
                path.display()
            ),
            StoreError::Corrupt { path, detail } if is_server(path) => write!(
                f,
                "the store at {} is damaged: {detail}. Nothing was changed; restore the database from a backup, or inspect it with psql",
                path.display()
            ),
            StoreError::Corrupt { path, detail } => write!(
                f,
                "the store at {} is damaged: {detail}. Nothing was changed; restore it from a backup, or inspect it with `sqlite3 {} 'PRAGMA integrity_check'`",
                path.display(),
                path.display()
            ),
            StoreError::NewerSchema {
                path,
                found,
                supported,
            } => write!(
                f,
                "the store at {} has schema version {found}, newer than the {supported} this poimen supports. Nothing was changed; use a newer poimen with this store",
                path.display()
            ),
            StoreError::Migration {
                path,
                version,
                cause,
            } => write!(
                f,
                "upgrading the store at {} to schema version {version} failed: {cause}. The upgrade was rolled back and the store is unchanged",
                path.display()
            ),
            StoreError::VersionHashMismatch { claimed, actual } => write!(
                f,
                "refused to publish: the canonical bytes hash to {actual}, not to the claimed {claimed}. Recompute the version from the bytes"
            ),
            StoreError::VersionConflict { version, detail } => write!(
                f,
                "version {version} is already stored with different content ({detail}). A version names its bytes, so this is corruption or a bug; the stored record was not changed"
            ),
            StoreError::UnknownParent { parent } => write!(
                f,
                "parent version {parent} is not in this store. Publish the parent first, or give no parent"
            ),
            StoreError::ParentOfOtherWorkflow {
                parent,
                parent_workflow,
                workflow,
            } => write!(
                f,
                "parent version {parent} belongs to workflow `{parent_workflow}`, not `{workflow}`: a version's parent must be a version of the same workflow"
            ),
            StoreError::ArmOtherWorkflow {
                version,
                its_workflow,
                workflow,
            } => write!(
                f,
                "version {version} is a version of `{its_workflow}`, not of `{workflow}`: arm a version of the workflow itself"
            ),
            StoreError::NotFound { what } => write!(f, "{what} is not in the store"),
            StoreError::AmbiguousPrefix { prefix, candidates } => {
                write!(
                    f,
                    "{prefix} matches {} versions; give more digits. Candidates:",
                    candidates.len()
                )?;
                for c in candidates {
                    write!(f, " {c}")?;
                }
                Ok(())
            }
            StoreError::IdempotencyConflict(c) => c.fmt(f),
            StoreError::RunIdConflict { id } => write!(
                f,
                "run id {id} is already used by a different run; generate a fresh id"
            ),
            StoreError::TenantMismatch {
                run,
                tenant,
                parent,
                parent_tenant,
            } => write!(
                f,
                "run {run} of tenant `{tenant}` cannot be a child of run {parent}, which belongs to tenant `{parent_tenant}`: a sub-workflow runs in its parent's tenant. Create the child with tenant `{parent_tenant}`; nothing was written"
            ),
            StoreError::SequenceConflict { run, expected, got } => write!(
                f,
                "run {run}: event sequence {got} does not continue the episode, which expects {expected} next. Another writer may be driving this run; nothing of this commit was written"
            ),
            StoreError::IntentOutOfOrder {
                run,
                step,
                iteration,
                attempt,
                phase,
                previous,
            } => {
                write!(
                    f,
                    "run {run}, step `{step}` (iteration {iteration}, attempt {attempt}): intent phase `{phase}` cannot follow "
                )?;
                match previous {
                    Some(p) => write!(f, "`{p}`")?,
                    None => f.write_str("nothing (the first phase must be `pending`)")?,
                }
                f.write_str("; nothing of this commit was written")
            }
            StoreError::JudgmentConflict { id, detail } => {
                write!(
                    f,
                    "judgment {id}: {detail}; nothing of this commit was written"
                )
            }
            StoreError::RunFinal { run, status } => write!(
                f,
                "run {run} is {status}, which is final: its status and output cannot change. Start a new run instead"
            ),
            StoreError::LeaseLost { run, fence, holder } => {
                write!(f, "run {run}: {fence} no longer holds this run; ")?;
                match holder {
                    Some(h) => write!(
                        f,
                        "host `{}` holds it now, at lease epoch {} (lease until {} ms)",
                        h.owner, h.epoch, h.expires_at
                    )?,
                    None => {
                        f.write_str("no host holds it (its lease was released, or the run ended)")?
                    }
                }
                f.write_str(
                    ". Nothing of this write was written; this host must stop driving the run \
                     (claim it again to resume it, if no other host drives it)",
                )
            }
            StoreError::AdmissionFull {
                group,
                max_runs,
                active,
            } => {
                let ids: Vec<&str> = active.iter().map(|r| r.as_str()).collect();
                write!(
                    f,
                    "concurrency group `{group}` is full: {} of at most {max_runs} runs are not yet ended ({}); the new run was refused and nothing was written. Start it again once one of them ends, or cancel one",
                    active.len(),
                    ids.join(", ")
                )
            }
            StoreError::InvalidCommit { run, detail } => write!(
                f,
                "commit for run {run} refused: {detail}; nothing of it was written"
            ),
            StoreError::ReadOnly { path, cause } if is_server(path) => write!(
                f,
                "the store at {} is read-only ({cause}): the server is a standby or refuses writes. Point the store at the primary; nothing was changed",
                path.display()
            ),
            StoreError::ReadOnly { path, cause } => write!(
                f,
                "the store at {} is read-only ({cause}). poimen writes the file and, beside it, its -wal and -shm files; make the file and its directory writable, or choose another store with --store or POIMEN_HOME. Nothing was changed",
                path.display()
            ),
            StoreError::Full { path } => write!(
                f,
                "the disk holding the store at {} is full (or the store reached its size limit). The write was rolled back and the store is consistent; free space and retry",
                path.display()
            ),
            StoreError::Busy { path } if is_server(path) => write!(
                f,
                "the store at {} could not take a lock in time (a serialization failure, deadlock or lock timeout); nothing was changed, retry",
                path.display()
            ),
            StoreError::Busy { path } => write!(
                f,
                "the store at {} is locked by another process; retry, or stop the other poimen using it",
                path.display()
            ),
            StoreError::Io { path, detail } => write!(
                f,
                "IO error on the store at {}: {detail}. The operation did not complete; check the disk and retry",
                path.display()
            ),
            StoreError::Sqlite {
                path,
                code,
                message,
            } => write!(
                f,
                "SQLite error {code} on the store at {}: {message}",
                path.display()
            ),
            StoreError::Unavailable {
                url_redacted,
                source_message,
            } => write!(
                f,
                "cannot reach the PostgreSQL server of the store at {url_redacted}: {source_message}. \
                 Check that the server runs and that this host can reach it, then retry; a write \
                 under way when the connection broke may or may not have been committed, so read \
                 the run back before redoing it"
            ),
            StoreError::AccessDenied {
                url_redacted,
                source_message,
            } => write!(
                f,
                "the PostgreSQL server of the store at {url_redacted} refused access: {source_message}. \
                 Check the user and password in the URL, and that the role may connect to the \
                 database and write its tables; nothing was changed"
            ),
            StoreError::Postgres {
                url_redacted,
                code,
                message,
            } => write!(
                f,
                "PostgreSQL error {code} on the store at {url_redacted}: {message}"
            ),
            StoreError::UnsupportedUrl {
                url_redacted,
                scheme,
                accepted,
            } => write!(
                f,
                "cannot open a store at `{url_redacted}`: this poimen opens no `{scheme}://` store. \
                 Accepted: {}",
                accepted.join(", ")
            ),
        }
    }
}

impl std::error::Error for StoreError {}
